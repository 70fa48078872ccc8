/* Fault-safe reads of this process's own memory.
 *
 * The native collector reads frames, thread states and code objects that the
 * threads it watches may free at any moment. A plain load of freed memory can
 * fault (CPython returns data-stack chunks to the OS with munmap), so every read of
 * memory the collector does not own goes through the kernel: process_vm_readv on our
 * own pid copies the bytes or fails with EFAULT, never a signal. Where that system
 * call is refused (some seccomp profiles), pread on /proc/self/mem does the same.
 * Each read costs a system call (2-3 us on these VMs), so callers batch: one read of
 * a whole thread state, one of a whole data-stack chunk.
 */
#ifndef STACKSHOT_SAFEREAD_H
#define STACKSHOT_SAFEREAD_H

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

typedef struct {
    pid_t pid;      /* our own pid (refreshed after fork) */
    int mem_fd;     /* /proc/self/mem, opened when process_vm_readv is refused */
    int use_pread;  /* 1 once process_vm_readv was refused */
} ss_reader;

static inline void ss_reader_init(ss_reader *r) {
    r->pid = getpid();
    r->mem_fd = -1;
    r->use_pread = 0;
}

static inline void ss_reader_close(ss_reader *r) {
    if (r->mem_fd >= 0) {
        close(r->mem_fd);
        r->mem_fd = -1;
    }
}

/* Copy n bytes at address src into dst. Returns 0 when all n bytes were copied, -1
 * when any of them could not be read (unmapped memory), never faults. */
static inline int ss_read(ss_reader *r, void *dst, uintptr_t src, size_t n) {
    if (n == 0) return 0;
    if (src == 0 || src + n < src) return -1;
    if (!r->use_pread) {
        struct iovec local = {dst, n};
        struct iovec remote = {(void *)src, n};
        ssize_t got = process_vm_readv(r->pid, &local, 1, &remote, 1, 0);
        if (got == (ssize_t)n) return 0;
        if (got >= 0 || errno == EFAULT || errno == ESRCH) return -1;
        if (errno != EPERM && errno != ENOSYS && errno != EACCES) return -1;
        r->use_pread = 1;  /* refused: fall through to /proc/self/mem from now on */
    }
    if (r->mem_fd < 0) {
        r->mem_fd = open("/proc/self/mem", O_RDONLY | O_CLOEXEC);
        if (r->mem_fd < 0) return -1;
    }
    ssize_t got = pread(r->mem_fd, dst, n, (off_t)src);
    return got == (ssize_t)n ? 0 : -1;
}

#endif
