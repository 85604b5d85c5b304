#define _GNU_SOURCE 1
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <pthread.h>
#include <unistd.h>
#include "CRelayIO.h"

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif

int relay_recv_batch(int fd, unsigned char *slots, size_t slot_size, int count, struct relay_datagram *out) {
    struct mmsghdr messages[RELAY_BATCH];
    struct iovec iovs[RELAY_BATCH];
    if (count > RELAY_BATCH) count = RELAY_BATCH;
    if (count <= 0) return 0;
    for (int i = 0; i < count; i++) {
        iovs[i].iov_base = slots + (size_t)i * slot_size;
        iovs[i].iov_len = slot_size;
        memset(&messages[i].msg_hdr, 0, sizeof(struct msghdr));
        messages[i].msg_hdr.msg_name = &out[i].from;
        messages[i].msg_hdr.msg_namelen = sizeof(struct sockaddr_storage);
        messages[i].msg_hdr.msg_iov = &iovs[i];
        messages[i].msg_hdr.msg_iovlen = 1;
    }
    int n;
    do {
        n = recvmmsg(fd, messages, (unsigned int)count, MSG_DONTWAIT, NULL);
    } while (n < 0 && errno == EINTR);
    for (int i = 0; i < n; i++) {
        out[i].length = (int32_t)messages[i].msg_len;
        out[i].truncated = (messages[i].msg_hdr.msg_flags & MSG_TRUNC) != 0;
        if ((size_t)messages[i].msg_len > slot_size) {
            out[i].length = (int32_t)slot_size;
            out[i].truncated = 1;
        }
    }
    return n;
}

int relay_send_batch(int fd, const struct relay_message *messages, int count, struct iovec *iovs) {
    struct mmsghdr headers[RELAY_BATCH];
    union {
        char bytes[CMSG_SPACE(sizeof(uint16_t))];
        struct cmsghdr align;
    } controls[RELAY_BATCH];
    if (count > RELAY_BATCH) count = RELAY_BATCH;
    if (count <= 0) return 0;
    for (int i = 0; i < count; i++) {
        struct msghdr *h = &headers[i].msg_hdr;
        memset(h, 0, sizeof(*h));
        h->msg_name = (void *)&messages[i].to;
        h->msg_namelen = messages[i].to_length;
        h->msg_iov = iovs + messages[i].iov_start;
        h->msg_iovlen = (size_t)messages[i].iov_count;
        if (messages[i].segment > 0) {
            memset(&controls[i], 0, sizeof(controls[i]));
            h->msg_control = controls[i].bytes;
            h->msg_controllen = sizeof(controls[i].bytes);
            struct cmsghdr *c = CMSG_FIRSTHDR(h);
            c->cmsg_level = SOL_UDP;
            c->cmsg_type = UDP_SEGMENT;
            c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
            uint16_t segment = messages[i].segment;
            memcpy(CMSG_DATA(c), &segment, sizeof(segment));
        }
    }
    int n;
    do {
        n = sendmmsg(fd, headers, (unsigned int)count, MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    return n;
}

int relay_epoll_create(void) { return epoll_create1(EPOLL_CLOEXEC); }

int relay_epoll_add(int epfd, int fd, uint64_t token, int oneshot) {
    struct epoll_event event = {.events = EPOLLIN | (oneshot ? EPOLLONESHOT : 0), .data = {.u64 = token}};
    return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &event);
}

int relay_epoll_rearm(int epfd, int fd, uint64_t token) {
    struct epoll_event event = {.events = EPOLLIN | EPOLLONESHOT, .data = {.u64 = token}};
    return epoll_ctl(epfd, EPOLL_CTL_MOD, fd, &event);
}

int relay_epoll_wait(int epfd, uint64_t *tokens, int max, int timeout_ms) {
    struct epoll_event events[RELAY_BATCH * 4];
    if (max > RELAY_BATCH * 4) max = RELAY_BATCH * 4;
    int n = epoll_wait(epfd, events, max, timeout_ms);
    for (int i = 0; i < n; i++) tokens[i] = events[i].data.u64;
    return n;
}

int relay_eventfd(void) { return eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); }

int relay_eventfd_signal(int fd) {
    uint64_t one = 1;
    return write(fd, &one, sizeof(one)) == sizeof(one) ? 0 : -1;
}

int relay_timerfd(void) { return timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC); }

int relay_timerfd_arm(int fd, int64_t nanoseconds) {
    struct itimerspec when = {0};
    when.it_value.tv_sec = nanoseconds / 1000000000;
    when.it_value.tv_nsec = nanoseconds % 1000000000;
    if (when.it_value.tv_sec == 0 && when.it_value.tv_nsec == 0) when.it_value.tv_nsec = 1;
    return timerfd_settime(fd, 0, &when, NULL);
}

void relay_drain_counter(int fd) {
    uint64_t count;
    while (read(fd, &count, sizeof(count)) == sizeof(count)) {}
}

int relay_pipe(int fds[2]) { return pipe2(fds, O_NONBLOCK | O_CLOEXEC); }

void relay_pipe_signal(int fd) {
    char one = 1;
    ssize_t n;
    do {
        n = write(fd, &one, 1);
    } while (n < 0 && errno == EINTR);
}

void relay_name_thread(const char *name) {
    char short_name[16];
    strncpy(short_name, name, sizeof(short_name) - 1);
    short_name[sizeof(short_name) - 1] = 0;
    pthread_setname_np(pthread_self(), short_name);
}
