#define _GNU_SOURCE 1
#include <stddef.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>
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

int bench_epoll_create(void) { return epoll_create1(EPOLL_CLOEXEC); }

int bench_epoll_add(int epfd, int fd, unsigned long long token) {
    struct epoll_event event = {.events = EPOLLIN, .data = {.u64 = token}};
    return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &event);
}

int bench_epoll_wait(int epfd, unsigned long long *tokens, int max, int timeout_ms) {
    struct epoll_event events[256];
    if (max > 256) max = 256;
    int n = epoll_wait(epfd, events, max, timeout_ms);
    for (int i = 0; i < n; i++) tokens[i] = events[i].data.u64;
    return n;
}

const unsigned int bench_PKTINFO_SPACE = CMSG_SPACE(sizeof(struct in_pktinfo));

unsigned int bench_pktinfo(void *control, unsigned int source) {
    memset(control, 0, CMSG_SPACE(sizeof(struct in_pktinfo)));
    struct msghdr m = {.msg_control = control, .msg_controllen = CMSG_SPACE(sizeof(struct in_pktinfo))};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = IPPROTO_IP;
    c->cmsg_type = IP_PKTINFO;
    c->cmsg_len = CMSG_LEN(sizeof(struct in_pktinfo));
    struct in_pktinfo info = {.ipi_ifindex = 0};
    info.ipi_spec_dst.s_addr = htonl(source);
    memcpy(CMSG_DATA(c), &info, sizeof info);
    return CMSG_SPACE(sizeof(struct in_pktinfo));
}

int bench_reuseaddr(int fd) {
    int one = 1;
    return setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
}

int bench_receive_pktinfo(int fd) {
    int one = 1;
    return setsockopt(fd, IPPROTO_IP, IP_PKTINFO, &one, sizeof one);
}

unsigned int bench_pktinfo_destination(const struct msghdr *msg) {
    for (struct cmsghdr *c = CMSG_FIRSTHDR((struct msghdr *)msg); c; c = CMSG_NXTHDR((struct msghdr *)msg, c)) {
        if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
            struct in_pktinfo info;
            memcpy(&info, CMSG_DATA(c), sizeof info);
            return ntohl(info.ipi_addr.s_addr);
        }
    }
    return 0;
}
