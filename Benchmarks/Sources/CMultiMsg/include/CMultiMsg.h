// sendmmsg/recvmmsg for Swift. Glibc declares them only under _GNU_SOURCE, which the
// Swift Glibc module is not built with, so this target re-declares the message vector
// with the same layout and forwards to the real calls (see CMultiMsg.c).
#ifndef CMULTIMSG_H
#define CMULTIMSG_H

#include <sys/socket.h>
#include <time.h>

/// Same layout as glibc's `struct mmsghdr` (checked in CMultiMsg.c).
struct bench_mmsghdr {
    struct msghdr msg_hdr;
    unsigned int msg_len;
};

int bench_sendmmsg(int fd, struct bench_mmsghdr *vec, unsigned int vlen, int flags);
int bench_recvmmsg(int fd, struct bench_mmsghdr *vec, unsigned int vlen, int flags, struct timespec *timeout);

/// MSG_WAITFORONE is a GNU extension too.
extern const int bench_MSG_WAITFORONE;

#endif
