#define _GNU_SOURCE 1
#include <stddef.h>
#include <sys/socket.h>
#include "CMultiMsg.h"

_Static_assert(sizeof(struct bench_mmsghdr) == sizeof(struct mmsghdr), "mmsghdr size");
_Static_assert(offsetof(struct bench_mmsghdr, msg_len) == offsetof(struct mmsghdr, msg_len), "mmsghdr layout");

const int bench_MSG_WAITFORONE = MSG_WAITFORONE;

int bench_sendmmsg(int fd, struct bench_mmsghdr *vec, unsigned int vlen, int flags) {
    return sendmmsg(fd, (struct mmsghdr *)vec, vlen, flags);
}

int bench_recvmmsg(int fd, struct bench_mmsghdr *vec, unsigned int vlen, int flags, struct timespec *timeout) {
    return recvmmsg(fd, (struct mmsghdr *)vec, vlen, flags, timeout);
}
