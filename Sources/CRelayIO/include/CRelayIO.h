// Batched UDP I/O for the TURN relay sockets: recvmmsg/sendmmsg (hidden behind
// _GNU_SOURCE in the Swift Glibc module), UDP GSO (UDP_SEGMENT), and the epoll,
// eventfd, pipe and thread-name calls of the relay poller (epoll_event is packed
// on x86-64). Only marshalling lives here; what is sent and read is decided in
// Swift (Transport/RelayIO.swift).
#ifndef CRELAYIO_H
#define CRELAYIO_H

#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>

/// Most messages one call reads or writes.
#define RELAY_BATCH 64

/// One received datagram.
struct relay_datagram {
    struct sockaddr_storage from;
    /// Bytes in the slot.
    int32_t length;
    /// The datagram was larger than its slot (MSG_TRUNC): its bytes are incomplete.
    int32_t truncated;
};

/// Reads up to `count` (≤ RELAY_BATCH) datagrams from `fd` without blocking,
/// datagram i into `slots + i * slot_size`. Returns how many, or -1 with errno.
int relay_recv_batch(int fd, unsigned char *slots, size_t slot_size, int count, struct relay_datagram *out);

/// One datagram to send, or with `segment` > 0 a UDP GSO write the kernel cuts
/// into datagrams of `segment` bytes (the last may be shorter).
struct relay_message {
    struct sockaddr_storage to;
    uint32_t to_length;
    /// Its bytes: iovs[iov_start ..< iov_start + iov_count].
    int32_t iov_start;
    int32_t iov_count;
    uint16_t segment;
};

/// Sends `count` (≤ RELAY_BATCH) messages on `fd` with one sendmmsg; returns
/// how many left, or -1 with errno when the first could not.
int relay_send_batch(int fd, const struct relay_message *messages, int count, struct iovec *iovs);

/// epoll: `token` comes back from relay_epoll_wait. `oneshot`: disarmed after one event.
int relay_epoll_create(void);
int relay_epoll_add(int epfd, int fd, uint64_t token, int oneshot);
int relay_epoll_rearm(int epfd, int fd, uint64_t token);
/// Waits up to `timeout_ms` (-1: forever) for readable fds; their tokens go to `tokens`.
int relay_epoll_wait(int epfd, uint64_t *tokens, int max, int timeout_ms);

/// A non-blocking close-on-exec eventfd, and the write that makes it readable.
int relay_eventfd(void);
int relay_eventfd_signal(int fd);

/// A non-blocking close-on-exec CLOCK_MONOTONIC timerfd; arming it fires it
/// once, `nanoseconds` from now (at least 1 ns); 0 or -1.
int relay_timerfd(void);
int relay_timerfd_arm(int fd, int64_t nanoseconds);
/// Reads an eventfd's or timerfd's counter until it is empty.
void relay_drain_counter(int fd);

/// A pipe, both ends non-blocking and close-on-exec: fds[0] reads, fds[1] writes. 0 or -1.
int relay_pipe(int fds[2]);
/// Writes one byte to a pipe (a full pipe is readable already: EAGAIN is fine).
void relay_pipe_signal(int fd);

/// Names the calling thread (at most 15 bytes are kept).
void relay_name_thread(const char *name);

#endif
