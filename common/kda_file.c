/*
 * kda_file.c - regular files only, opened without blocking (see kda_file.h).
 */
#include "kda_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *not_regular(mode_t m)
{
    return S_ISDIR(m) ? "is a directory, not a file"
         : S_ISFIFO(m) ? "is a FIFO (named pipe), not a regular file"
         : S_ISCHR(m) ? "is a character device, not a regular file"
         : S_ISBLK(m) ? "is a block device, not a regular file"
         : S_ISSOCK(m) ? "is a socket, not a regular file" : "is not a regular file";
}

int kda_file_open(const char *path, struct stat *st, char *err, size_t errlen)
{
    /* O_NONBLOCK: open() of a FIFO returns at once instead of waiting for a
     * writer; it means nothing for a regular file, and is cleared anyway. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "%s: %s", path, strerror(e));
        errno = e;
        return -1;
    }
    if (fstat(fd, st) != 0) {
        int e = errno;
        snprintf(err, errlen, "%s: cannot stat: %s", path, strerror(e));
        close(fd);
        errno = e;
        return -1;
    }
    if (!S_ISREG(st->st_mode)) {
        snprintf(err, errlen, "%s: %s", path, not_regular(st->st_mode));
        close(fd);
        errno = S_ISDIR(st->st_mode) ? EISDIR : EINVAL;
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
}

char *kda_file_read(const char *path, size_t max, size_t *len, char *err, size_t errlen)
{
    struct stat st;
    int fd = kda_file_open(path, &st, err, errlen);
    if (fd < 0) return NULL;
    if ((unsigned long long)st.st_size > max) {
        snprintf(err, errlen, "%s: %lld bytes, more than the %zu MiB this file may hold", path, (long long)st.st_size,
                 max >> 20);
        close(fd);
        errno = EFBIG;
        return NULL;
    }
    /* Sized by fstat, read to EOF but never past max: a file that grows
     * while it is read is cut off with an error, not followed. */
    size_t cap = (size_t)st.st_size + 1, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        if (n == cap) {
            if (n > max) break;
            size_t ncap = cap * 2 > max + 1 ? max + 1 : cap * 2;
            char *nb = ncap > cap ? realloc(buf, ncap + 1) : NULL;
            if (!nb) break;
            buf = nb;
            cap = ncap;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            snprintf(err, errlen, "%s: read failed: %s", path, strerror(e));
            free(buf);
            close(fd);
            errno = e;
            return NULL;
        }
        if (r == 0) {
            close(fd);
            buf[n] = '\0';
            if (len) *len = n;
            return buf;
        }
        n += (size_t)r;
    }
    int grew = buf != NULL && n > max;
    if (grew) snprintf(err, errlen, "%s: grew past the %zu MiB this file may hold while it was read", path, max >> 20);
    else snprintf(err, errlen, "%s: out of memory", path);
    free(buf);
    close(fd);
    errno = grew ? EFBIG : ENOMEM;
    return NULL;
}
