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

/// epoll for many receivers (struct epoll_event is packed on x86-64, which Swift
/// does not import faithfully): `token` comes back from bench_epoll_wait.
int bench_epoll_create(void);
int bench_epoll_add(int epfd, int fd, unsigned long long token);
/// Waits up to `timeout_ms` (0: poll); the ready fds' tokens go to `tokens`.
int bench_epoll_wait(int epfd, unsigned long long *tokens, int max, int timeout_ms);

/// Bytes of control data bench_pktinfo writes.
extern const unsigned int bench_PKTINFO_SPACE;
/// Writes an IP_PKTINFO control message into `control` (bench_PKTINFO_SPACE bytes)
/// that makes a datagram leave from IPv4 address `source` (host order); returns its length.
unsigned int bench_pktinfo(void *control, unsigned int source);
/// Turns on IP_PKTINFO for received datagrams; 0 or -1.
int bench_receive_pktinfo(int fd);
/// The IPv4 destination (host order) of a datagram received with IP_PKTINFO on; 0 if absent.
unsigned int bench_pktinfo_destination(const struct msghdr *msg);
/// Sets SO_REUSEADDR; 0 or -1.
int bench_reuseaddr(int fd);

#endif
