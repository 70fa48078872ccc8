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
    unsigned long long calls;  /* system calls made to read (what reads cost: counted) */
} ss_reader;

static inline void ss_reader_init(ss_reader *r) {
    r->pid = getpid();
    r->mem_fd = -1;
    r->use_pread = 0;
    r->calls = 0;
}

static inline void ss_reader_close(ss_reader *r) {
    if (r->mem_fd >= 0) {
        close(r->mem_fd);
        r->mem_fd = -1;
    }
}

/* Copy n ranges in one system call, in order: part i is the len[i] bytes at src[i],
 * into dst[i]. Returns how many leading parts were copied whole (0 to n); the part
 * after them, if any, could not be read (unmapped memory: never a fault), and the
 * parts after that were not tried. The kernel copies the parts one after another, so
 * the first part is read at the earliest moment, as with separate reads in that
 * order, for one system call instead of n (each costs 1-3 us on these VMs). At most
 * SS_READV_MAX parts. Where process_vm_readv is refused, /proc/self/mem is read
 * instead, a part at a time, from then on. */
#define SS_READV_MAX 4
static inline int ss_readv(ss_reader *r, void *const dst[], const uintptr_t src[], const size_t len[], int n) {
    if (n > SS_READV_MAX) n = SS_READV_MAX;
    int valid = 0;  /* leading parts with an address that can be asked for */
    while (valid < n && src[valid] != 0 && len[valid] != 0 && src[valid] + len[valid] > src[valid]) valid++;
    if (valid == 0) return 0;
    if (!r->use_pread) {
        struct iovec local[SS_READV_MAX], remote[SS_READV_MAX];
        for (int i = 0; i < valid; i++) {
            local[i].iov_base = dst[i];
            local[i].iov_len = len[i];
            remote[i].iov_base = (void *)src[i];
            remote[i].iov_len = len[i];
        }
        r->calls++;
        ssize_t got = process_vm_readv(r->pid, local, (unsigned long)valid, remote, (unsigned long)valid, 0);
        if (got >= 0) {
            int whole = 0;
            size_t sum = 0;
            while (whole < valid && sum + len[whole] <= (size_t)got) sum += len[whole++];
            return whole;
        }
        if (errno != EPERM && errno != ENOSYS && errno != EACCES) return 0;  /* (EFAULT, ESRCH: unreadable) */
        r->use_pread = 1;  /* refused: fall through to /proc/self/mem from now on */
    }
    if (r->mem_fd < 0) {
        r->mem_fd = open("/proc/self/mem", O_RDONLY | O_CLOEXEC);
        if (r->mem_fd < 0) return 0;
    }
    int whole = 0;
    while (whole < valid) {
        r->calls++;
        if (pread(r->mem_fd, dst[whole], len[whole], (off_t)src[whole]) != (ssize_t)len[whole]) break;
        whole++;
    }
    return whole;
}

/* How this process can read its own memory fault-safely, tried on bytes of its own
 * stack: SS_READ_VM (process_vm_readv), SS_READ_MEM (/proc/self/mem, where the
 * system call is refused), or SS_READ_NONE (neither: a seccomp profile that refuses
 * both, /proc not mounted). The errno of each refusal is left in *vm_errno and
 * *mem_errno (0 where that way worked or was not tried). Without a way the engine
 * cannot read a frame: each walk would fail, and a sampler would run and take
 * nothing; the probe lets the Python side say so before a sampler starts. */
#define SS_READ_NONE 0
#define SS_READ_VM 1
#define SS_READ_MEM 2
static inline int ss_read_probe(int *vm_errno, int *mem_errno) {
    volatile uint64_t here = 0x5354434b53484f54ULL;  /* the bytes read back */
    uint64_t copy = 0;
    struct iovec local = {&copy, sizeof copy}, remote = {(void *)&here, sizeof here};
    *vm_errno = *mem_errno = 0;
    ssize_t got = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
    if (got == (ssize_t)sizeof copy && copy == here) return SS_READ_VM;
    *vm_errno = got < 0 ? errno : EIO;
    copy = 0;
    int fd = open("/proc/self/mem", O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        *mem_errno = errno;
        return SS_READ_NONE;
    }
    got = pread(fd, &copy, sizeof copy, (off_t)(uintptr_t)&here);
    *mem_errno = got < 0 ? errno : 0;
    close(fd);
    if (got == (ssize_t)sizeof copy && copy == here) return SS_READ_MEM;
    if (*mem_errno == 0) *mem_errno = EIO;
    return SS_READ_NONE;
}

/* Start a reader on the way the probe found (SS_READ_MEM: straight to /proc/self/mem,
 * without a refused system call first). */
static inline void ss_reader_use(ss_reader *r, int way) {
    r->use_pread = way == SS_READ_MEM;
}

/* Copy n bytes at address src into dst. Returns 0 when all n bytes were copied, -1
 * when any of them could not be read (unmapped memory), never faults. */
static inline int ss_read(ss_reader *r, void *dst, uintptr_t src, size_t n) {
    if (n == 0) return 0;
    return ss_readv(r, &dst, &src, &n, 1) == 1 ? 0 : -1;
}

#endif
