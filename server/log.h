/* log.h - leveled stderr logging and a monotonic clock for the server. */
#ifndef SRV_LOG_H
#define SRV_LOG_H

enum { SRV_LOG_ERROR = 0, SRV_LOG_WARN, SRV_LOG_INFO, SRV_LOG_DEBUG };

extern int srv_log_level;   /* set once at startup, read everywhere */

int srv_log_parse_level(const char *name);   /* -1 if unknown */
void srv_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
double srv_now(void);        /* monotonic seconds */
double srv_wall(void);       /* seconds since the epoch */

#endif
