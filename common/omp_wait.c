/*
 * omp_wait.c - OpenMP threads that wait politely on a shared machine.
 *
 * libgomp's idle threads spin (300,000 rounds by default) at every barrier
 * and between parallel regions before they sleep. On a machine whose cores
 * are busy with other work, a spinning thread holds a core the thread with
 * the remaining work needs: one decode step of the demo model went from
 * 3.1 ms to 59.7 ms, some to a second (issue 19, item 12). Passive waiting
 * (sleep in the kernel at once) fixes that at a small cost on a quiet
 * machine (bench figures in the README).
 *
 * libgomp reads OMP_WAIT_POLICY / GOMP_SPINCOUNT once, in its own library
 * constructor, which runs before main(): a setenv() in main is too late. An
 * entry in the executable's .preinit_array runs before the constructors of
 * any shared library (the ELF rule; the sanitizers start the same way), so
 * the setting is in the environment when libgomp looks. A user's own
 * OMP_WAIT_POLICY or GOMP_SPINCOUNT is left as it is.
 *
 * Linked into the executables (kda-server, kda-cli) only: .preinit_array is
 * honoured in the main program, not in a library.
 */
#include <stdlib.h>

static void omp_wait_passive(int argc, char **argv, char **envp)
{
    (void)argc, (void)argv, (void)envp;
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;
    setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
}

__attribute__((section(".preinit_array"), used)) static void (*const omp_wait_preinit)(int, char **, char **) =
    omp_wait_passive;
