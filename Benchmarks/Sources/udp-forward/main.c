// udp-forward: the machine's limit for a TURN relay, the baseline Benchmarks/turn-bench.sh
// runs beside tusa and coturn with the same load generator (turn-load).
//
// It does the per-packet work of a TURN relay over UDP and nothing else: the same
// syscalls (recvmmsg on the listener and on relay sockets, sendmmsg/sendmsg out), one
// hash lookup per packet, the ChannelData header removed on the way to the peer and
// added on the way back. None of TURN's checks: no authentication, no permissions, no
// lifetimes, no nonce. Allocate gets a relay socket at once (no 401 challenge, so a
// client's first, unauthenticated request succeeds); ChannelBind binds without checks.
// Nothing expires. Single thread, one level-triggered epoll set, no per-packet malloc.
//
// With --uring, the relay sockets go through io_uring instead (liburing): a multishot
// recvmsg armed on each, into one ring of provided buffers, and the payloads toward peers
// queued as sendmsg entries and submitted together, one io_uring_enter per listener
// batch, so that no relay socket costs a syscall of its own per packet; the listener keeps
// its recvmmsg and sendmmsg. What that saves on this machine is what a relay could gain
// from io_uring (issue 17).
//
// usage: udp-forward [--uring] --listen IPV4:PORT    (loopback only; port 0 = any free port)
// prints 'listening IP:PORT' on start; on SIGTERM/SIGINT the counters on stderr, exit 0.
// Counters: dropped = unroutable (unknown client, unbound channel or peer, EAGAIN on
// send); ignored = anything that is neither an Allocate/ChannelBind request nor
// well-formed ChannelData.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include "CForwarder.h"
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <liburing.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#define BATCH 64           // messages per recvmmsg / sendmmsg
#define BUDGET 256         // datagrams read from one socket per wake
#define BUFSIZE 2048       // per datagram
#define MAX_CHANNELS 8     // per allocation
#define MAGIC 0x2112A442u

struct channel {
    uint16_t number;
    uint16_t peer_port;    // host order, as every address below
    uint32_t peer_ip;
};

struct allocation {
    uint32_t ip;           // client
    uint16_t port;
    uint16_t relay_port;   // relay socket on 127.0.0.1
    int fd;
    int nchannels;
    struct channel channels[MAX_CHANNELS];
};

static struct allocation *allocs;    // grows on Allocate only
static uint32_t nallocs, cap_allocs;
static uint32_t *table;              // open addressing: allocation index + 1, 0 = empty
static uint32_t table_mask;
static int32_t *by_fd;               // relay socket fd -> allocation index, -1 = none
static int nby_fd;

static int listener, epfd;
static int use_uring;
static unsigned long long n_channels, to_peer, to_client, dropped, ignored;

// Listener batch: datagrams from clients, and ChannelData payloads queued to peers.
static char lbuf[BATCH][BUFSIZE];
static struct sockaddr_in lname[BATCH];
static struct iovec liov[BATCH];
static struct mmsghdr lmsg[BATCH];
static struct sockaddr_in pdest[BATCH];
static struct iovec piov[BATCH];
static struct mmsghdr pmsg[BATCH];
static int pfd[BATCH];
static int npeer;

// ChannelData toward clients. Slot k's buffer cbuf[k] receives a peer's datagram (rmsg)
// after room for the 4-byte header, then is sent from the listener (cmsg) in place.
static char cbuf_store[BATCH][BUFSIZE + 4];
static char *cbuf[BATCH];
static struct sockaddr_in rname[BATCH];
static struct iovec riov[BATCH];
static struct mmsghdr rmsg[BATCH];
static struct sockaddr_in cdest[BATCH];
static struct iovec ciov[BATCH];
static struct mmsghdr cmsg[BATCH];
static int nclient;

static uint16_t be16(const char *p) { return (uint16_t)((uint8_t)p[0] << 8 | (uint8_t)p[1]); }
static uint32_t be32(const char *p) { return (uint32_t)be16(p) << 16 | be16(p + 2); }
static void put16(char *p, uint16_t v) { p[0] = (char)(v >> 8); p[1] = (char)v; }
static void put32(char *p, uint32_t v) { put16(p, (uint16_t)(v >> 16)); put16(p + 2, (uint16_t)v); }

static void fail(const char *what) {
    fprintf(stderr, "udp-forward: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void set_buffers(int fd, int rcv, int snd) {
    if (rcv) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof rcv);
    if (snd) setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &snd, sizeof snd);
}

static struct sockaddr_in sockaddr_v4(uint32_t ip, uint16_t port) {
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(port)};
    sin.sin_addr.s_addr = htonl(ip);
    return sin;
}

// MARK: - Allocations by client address

static uint32_t slot_of(uint32_t ip, uint16_t port) {
    uint64_t key = (uint64_t)ip << 16 | port;
    return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & table_mask;
}

static struct allocation *find(uint32_t ip, uint16_t port) {
    for (uint32_t s = slot_of(ip, port);; s = (s + 1) & table_mask) {
        if (table[s] == 0) return NULL;
        struct allocation *a = &allocs[table[s] - 1];
        if (a->ip == ip && a->port == port) return a;
    }
}

static void insert(uint32_t index) {
    uint32_t s = slot_of(allocs[index].ip, allocs[index].port);
    while (table[s] != 0) s = (s + 1) & table_mask;
    table[s] = index + 1;
}

static void grow_table(void) {
    uint32_t size = table ? (table_mask + 1) * 2 : 1024;
    free(table);
    if (!(table = calloc(size, sizeof *table))) fail("calloc");
    table_mask = size - 1;
    for (uint32_t i = 0; i < nallocs; i++) insert(i);
}

// MARK: - io_uring (--uring)

#define NBUFS 4096       // provided buffers for the relay sockets' multishot reads
#define RBUFSZ 2048
#define TAG_RELAY (1ull << 32)   // | fd
#define TAG_SEND (2ull << 32)
#define TAG_LISTENER (3ull << 32)

static struct io_uring ring;
static struct io_uring_buf_ring *buffer_ring;
static char *buffers;
/// Each read's layout in its buffer: io_uring_recvmsg_out, the peer's sockaddr_in, the payload.
static struct msghdr recv_layout = {.msg_namelen = sizeof(struct sockaddr_in)};
static int client_bid[BATCH];      // the buffer each queued ChannelData toward a client lives in
static int free_bids[NBUFS];       // buffers to give back to the ring
static int nfree_bids;
static int *to_rearm;              // relay sockets whose multishot read ended (room for every fd)
static int nrearm;

static struct io_uring_sqe *next_sqe(void) {
    struct io_uring_sqe *e = io_uring_get_sqe(&ring);
    if (!e) {
        io_uring_submit(&ring);
        e = io_uring_get_sqe(&ring);
    }
    if (!e) fail("io_uring_get_sqe");
    return e;
}

static void arm_relay(int fd) {
    struct io_uring_sqe *e = next_sqe();
    io_uring_prep_recvmsg_multishot(e, fd, &recv_layout, 0);
    e->flags |= IOSQE_BUFFER_SELECT;
    e->buf_group = 0;
    io_uring_sqe_set_data64(e, TAG_RELAY | (uint32_t)fd);
}

static void arm_listener(void) {
    struct io_uring_sqe *e = next_sqe();
    io_uring_prep_poll_multishot(e, listener, POLLIN);
    io_uring_sqe_set_data64(e, TAG_LISTENER);
}

static void uring_start(void) {
    struct io_uring_params params = {
        .flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_CQSIZE | IORING_SETUP_SUBMIT_ALL,
        .cq_entries = 65536};
    int r = io_uring_queue_init_params(4096, &ring, &params);
    if (r < 0) {
        errno = -r;
        fail("io_uring_queue_init");
    }
    buffer_ring = mmap(NULL, NBUFS * sizeof(struct io_uring_buf), PROT_READ | PROT_WRITE, MAP_ANONYMOUS | MAP_PRIVATE,
                       -1, 0);
    if (buffer_ring == MAP_FAILED || !(buffers = malloc((size_t)NBUFS * RBUFSZ))) fail("io_uring buffers");
    io_uring_buf_ring_init(buffer_ring);
    struct io_uring_buf_reg reg = {.ring_addr = (unsigned long)buffer_ring, .ring_entries = NBUFS, .bgid = 0};
    if ((r = io_uring_register_buf_ring(&ring, &reg, 0)) != 0) {
        errno = -r;
        fail("io_uring_register_buf_ring");
    }
    for (int k = 0; k < NBUFS; k++)
        io_uring_buf_ring_add(buffer_ring, buffers + (size_t)k * RBUFSZ, RBUFSZ, (unsigned short)k,
                              io_uring_buf_ring_mask(NBUFS), k);
    io_uring_buf_ring_advance(buffer_ring, NBUFS);
    arm_listener();
}

/// Gives the sent and refused buffers back to the ring and arms the reads that ended
/// (one ends when the ring had no buffer for it: ENOBUFS).
static void uring_recycle(void) {
    for (int k = 0; k < nfree_bids; k++)
        io_uring_buf_ring_add(buffer_ring, buffers + (size_t)free_bids[k] * RBUFSZ, RBUFSZ,
                              (unsigned short)free_bids[k], io_uring_buf_ring_mask(NBUFS), k);
    io_uring_buf_ring_advance(buffer_ring, nfree_bids);
    nfree_bids = 0;
    for (int k = 0; k < nrearm; k++) arm_relay(to_rearm[k]);
    nrearm = 0;
}

/// A new allocation with its relay socket, or NULL when no socket could be made.
static struct allocation *allocate(uint32_t ip, uint16_t port) {
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in sin = sockaddr_v4(INADDR_LOOPBACK, 0);
    socklen_t len = sizeof sin;
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
    if (fd >= 0) set_buffers(fd, 256 << 10, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sin, sizeof sin) != 0 ||
        getsockname(fd, (struct sockaddr *)&sin, &len) != 0 ||
        (!use_uring && epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) != 0)) {
        static int warned;
        if (!warned++) fprintf(stderr, "udp-forward: relay socket: %s (raise ulimit -n?)\n", strerror(errno));
        if (fd >= 0) close(fd);
        return NULL;
    }
    if (nallocs == cap_allocs) {
        cap_allocs = cap_allocs ? cap_allocs * 2 : 1024;
        if (!(allocs = realloc(allocs, cap_allocs * sizeof *allocs))) fail("realloc");
    }
    if (fd >= nby_fd) {
        int n = nby_fd ? nby_fd : 1024;
        while (n <= fd) n *= 2;
        if (!(by_fd = realloc(by_fd, n * sizeof *by_fd))) fail("realloc");
        if (use_uring && !(to_rearm = realloc(to_rearm, n * sizeof *to_rearm))) fail("realloc");
        for (int i = nby_fd; i < n; i++) by_fd[i] = -1;
        nby_fd = n;
    }
    allocs[nallocs] = (struct allocation){.ip = ip, .port = port, .relay_port = ntohs(sin.sin_port), .fd = fd};
    by_fd[fd] = (int32_t)nallocs;
    if (use_uring) arm_relay(fd);
    nallocs++;
    if ((uint64_t)nallocs * 2 > table_mask + 1) grow_table();
    else insert(nallocs - 1);
    return &allocs[nallocs - 1];
}

// MARK: - Sending

/// Sends n prepared messages from fd: sendmsg for one, sendmmsg for more. EAGAIN drops
/// the rest; another error drops that one message.
static void send_all(int fd, struct mmsghdr *m, int n, unsigned long long *sent) {
    while (n > 0) {
        int r = n == 1 ? (sendmsg(fd, &m->msg_hdr, MSG_DONTWAIT) < 0 ? -1 : 1) : sendmmsg(fd, m, n, MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                dropped += n;
                return;
            }
            dropped++;
            r = 1;
        } else {
            *sent += r;
        }
        m += r;
        n -= r;
    }
}

/// Payloads queued to peers during one listener batch: runs on the same relay socket
/// go out in one sendmmsg.
static void flush_peers(void) {
    if (use_uring) {
        // Issued inline by the submit (MSG_DONTWAIT: a full socket fails rather than
        // waits), so the listener's buffers are free again when it returns; only
        // failures complete.
        for (int i = 0; i < npeer; i++) {
            struct io_uring_sqe *e = next_sqe();
            io_uring_prep_sendmsg(e, pfd[i], &pmsg[i].msg_hdr, MSG_DONTWAIT);
            e->flags |= IOSQE_CQE_SKIP_SUCCESS;
            io_uring_sqe_set_data64(e, TAG_SEND);
        }
        to_peer += npeer;
        // Every entry must be issued now: one left in the ring would send what the
        // next recvmmsg writes into its buffer.
        if (npeer && (io_uring_submit(&ring) < 0 || io_uring_sq_ready(&ring) != 0)) fail("io_uring_submit");
        npeer = 0;
        return;
    }
    for (int i = 0, j; i < npeer; i = j) {
        for (j = i + 1; j < npeer && pfd[j] == pfd[i]; j++) {}
        send_all(pfd[i], &pmsg[i], j - i, &to_peer);
    }
    npeer = 0;
}

static void flush_clients(void) {
    send_all(listener, cmsg, nclient, &to_client);
    if (use_uring) {
        for (int k = 0; k < nclient; k++) free_bids[nfree_bids++] = client_bid[k];
        uring_recycle();
    }
    nclient = 0;
}

static void reply(const struct sockaddr_in *to, const char *msg, int len) {
    if (sendto(listener, msg, len, MSG_DONTWAIT, (const struct sockaddr *)to, sizeof *to) < 0) dropped++;
}

// MARK: - STUN

/// Writes an XOR address attribute (RFC 8489 section 14.2, IPv4) at p; returns its size.
static int put_xor_address(char *p, uint16_t type, uint32_t ip, uint16_t port) {
    put16(p, type);
    put16(p + 2, 8);
    put16(p + 4, 0x0001);
    put16(p + 6, port ^ (uint16_t)(MAGIC >> 16));
    put32(p + 8, ip ^ MAGIC);
    return 12;
}

/// Header of a success response to request q, attributes already written after it.
static void finish_response(char *r, const char *q, uint16_t type, int length) {
    put16(r, type);
    put16(r + 2, (uint16_t)length);
    memcpy(r + 4, q + 4, 16);  // magic cookie and transaction id
}

static void on_allocate(const char *q, uint32_t ip, uint16_t port, const struct sockaddr_in *from) {
    struct allocation *a = find(ip, port);
    if (!a && !(a = allocate(ip, port))) return;
    char r[64];
    int n = 20;
    n += put_xor_address(r + n, 0x0016, INADDR_LOOPBACK, a->relay_port);
    n += put_xor_address(r + n, 0x0020, ip, port);
    put16(r + n, 0x000D);
    put16(r + n + 2, 4);
    put32(r + n + 4, 600);
    n += 8;
    finish_response(r, q, 0x0103, n - 20);
    reply(from, r, n);
}

static void on_channel_bind(const char *q, int len, uint32_t ip, uint16_t port, const struct sockaddr_in *from) {
    struct allocation *a = find(ip, port);
    int number = -1;
    uint32_t peer_ip = 0;
    uint16_t peer_port = 0;
    for (int i = 20; i + 4 <= len;) {
        uint16_t type = be16(q + i), length = be16(q + i + 2);
        if (i + 4 + length > len) break;
        if (type == 0x000C && length == 4) number = be16(q + i + 4);
        if (type == 0x0012 && length == 8 && q[i + 5] == 0x01) {
            peer_port = be16(q + i + 6) ^ (uint16_t)(MAGIC >> 16);
            peer_ip = be32(q + i + 8) ^ MAGIC;
        }
        i += 4 + ((length + 3) & ~3);
    }
    if (!a || number < 0x4000 || number > 0x4FFF || peer_port == 0) {
        if (a) ignored++;
        else dropped++;
        return;
    }
    // Rebinding the same channel or the same peer replaces the entry (no TURN rules).
    int k = 0;
    while (k < a->nchannels && a->channels[k].number != number &&
           !(a->channels[k].peer_ip == peer_ip && a->channels[k].peer_port == peer_port))
        k++;
    if (k == MAX_CHANNELS) {
        ignored++;
        return;
    }
    if (k == a->nchannels) {
        a->nchannels++;
        n_channels++;
    }
    a->channels[k] = (struct channel){.number = (uint16_t)number, .peer_port = peer_port, .peer_ip = peer_ip};
    char r[20];
    finish_response(r, q, 0x0109, 0);
    reply(from, r, 20);
}

// MARK: - Datagrams

static void on_client_datagram(char *p, int len, const struct sockaddr_in *from) {
    uint32_t ip = ntohl(from->sin_addr.s_addr);
    uint16_t port = ntohs(from->sin_port);
    uint8_t first = (uint8_t)p[0];
    if (len >= 4 && first >= 0x40 && first <= 0x7F) {
        uint16_t length = be16(p + 2);
        if (4 + length > len) {
            ignored++;
            return;
        }
        struct allocation *a = find(ip, port);
        uint16_t number = be16(p);
        int k = 0;
        while (a && k < a->nchannels && a->channels[k].number != number) k++;
        if (!a || k == a->nchannels) {
            dropped++;
            return;
        }
        pdest[npeer] = sockaddr_v4(a->channels[k].peer_ip, a->channels[k].peer_port);
        piov[npeer] = (struct iovec){.iov_base = p + 4, .iov_len = length};
        pfd[npeer] = a->fd;
        npeer++;
        return;
    }
    if (len >= 20 && (first & 0xC0) == 0 && be32(p + 4) == MAGIC && 20 + be16(p + 2) == len && len % 4 == 0) {
        uint16_t type = be16(p);
        if (type == 0x0003) return on_allocate(p, ip, port, from);
        if (type == 0x0009) return on_channel_bind(p, len, ip, port, from);
    }
    ignored++;
}

/// Returns 1 when it stopped at its budget with datagrams perhaps left (level-triggered
/// epoll comes back for them; the --uring loop must look again itself).
static int read_listener(void) {
    for (int budget = BUDGET; budget > 0; budget -= BATCH) {
        int r = recvmmsg(listener, lmsg, BATCH, MSG_DONTWAIT, NULL);
        if (r <= 0) return 0;  // EAGAIN (or EINTR: level-triggered epoll brings us back)
        for (int k = 0; k < r; k++) {
            on_client_datagram(lbuf[k], (int)lmsg[k].msg_len, &lname[k]);
            lmsg[k].msg_hdr.msg_namelen = sizeof lname[k];
        }
        flush_peers();
        if (r < BATCH) return 0;
    }
    return 1;
}

/// The channel of `a` bound to the peer ip:port, or a->nchannels when none is.
static int channel_of_peer(const struct allocation *a, uint32_t ip, uint16_t port) {
    int c = 0;
    while (c < a->nchannels && !(a->channels[c].peer_ip == ip && a->channels[c].peer_port == port)) c++;
    return c;
}

/// Queues the `length` bytes at p + 4 toward a's client as ChannelData on channel c,
/// its header written into p's first four bytes.
static void queue_to_client(const struct allocation *a, int c, char *p, unsigned length) {
    put16(p, a->channels[c].number);
    put16(p + 2, (uint16_t)length);
    cdest[nclient] = sockaddr_v4(a->ip, a->port);
    ciov[nclient] = (struct iovec){.iov_base = p, .iov_len = 4 + length};
    nclient++;
}

/// Datagrams from peers on one relay socket become ChannelData toward its client.
static void read_relay(int fd) {
    const struct allocation *a = &allocs[by_fd[fd]];
    for (int budget = BUDGET; budget > 0;) {
        int base = nclient, room = BATCH - nclient;
        int r = recvmmsg(fd, &rmsg[base], room, MSG_DONTWAIT, NULL);
        if (r <= 0) return;
        budget -= r;
        for (int s = base; s < base + r; s++) {
            struct msghdr *h = &rmsg[s].msg_hdr;
            uint32_t ip = ntohl(rname[s].sin_addr.s_addr);
            uint16_t port = ntohs(rname[s].sin_port);
            unsigned length = rmsg[s].msg_len;
            int c = channel_of_peer(a, ip, port);
            int keep = c < a->nchannels && !(h->msg_flags & MSG_TRUNC);
            h->msg_namelen = sizeof rname[s];
            if (!keep) {
                dropped++;
                continue;
            }
            if (s != nclient) {  // slots dropped before this one: move its buffer down
                char *p = cbuf[s];
                cbuf[s] = cbuf[nclient];
                cbuf[nclient] = p;
                riov[s].iov_base = cbuf[s] + 4;
                riov[nclient].iov_base = p + 4;
            }
            queue_to_client(a, c, cbuf[nclient], length);
        }
        if (nclient == BATCH) flush_clients();
        if (r < room) return;
    }
}

/// One multishot read's completion on a relay socket (--uring): its datagram becomes
/// ChannelData toward the client in place, the header over the end of the peer's address.
static void on_relay_completion(const struct io_uring_cqe *c) {
    int fd = (int)(uint32_t)c->user_data;
    if (!(c->flags & IORING_CQE_F_MORE)) to_rearm[nrearm++] = fd;
    if (c->res < 0 || !(c->flags & IORING_CQE_F_BUFFER)) return;
    int bid = (int)(c->flags >> IORING_CQE_BUFFER_SHIFT);
    struct io_uring_recvmsg_out *o = io_uring_recvmsg_validate(buffers + (size_t)bid * RBUFSZ, c->res, &recv_layout);
    const struct allocation *a = fd < nby_fd && by_fd[fd] >= 0 ? &allocs[by_fd[fd]] : NULL;
    int ch = 0;
    if (o && a && !(o->flags & MSG_TRUNC) && o->namelen >= sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *from = io_uring_recvmsg_name(o);
        ch = channel_of_peer(a, ntohl(from->sin_addr.s_addr), ntohs(from->sin_port));
    }
    if (!o || !a || ch == a->nchannels || (o->flags & MSG_TRUNC)) {
        dropped++;
        free_bids[nfree_bids++] = bid;
        return;
    }
    client_bid[nclient] = bid;
    queue_to_client(a, ch, (char *)io_uring_recvmsg_payload(o, &recv_layout) - 4,  // header over sin_zero
                    io_uring_recvmsg_payload_length(o, c->res, &recv_layout));
    if (nclient == BATCH) flush_clients();
}

/// The --uring loop: one io_uring_enter waits for the listener and the relay sockets'
/// reads together. (A signalfd polled through the ring never completes here: the
/// signal is looked for when a wait times out, and every 256 wakes.)
static void run_uring(int sfd) {
    struct __kernel_timespec tick = {.tv_nsec = 100 * 1000 * 1000};
    int listener_pending = 0;
    for (unsigned wakes = 0;; wakes++) {
        struct io_uring_cqe *first;
        int r = listener_pending ? io_uring_submit(&ring)
                                 : io_uring_submit_and_wait_timeout(&ring, &first, 1, &tick, NULL);
        struct pollfd stop = {.fd = sfd, .events = POLLIN};
        if ((r == -ETIME || wakes % 256 == 0) && poll(&stop, 1, 0) > 0) return;
        if (r < 0 && r != -EINTR && r != -ETIME) {
            errno = -r;
            fail("io_uring_submit_and_wait");
        }
        int listener_ready = 0;
        unsigned head, seen = 0;
        struct io_uring_cqe *c;
        io_uring_for_each_cqe(&ring, head, c) {
            seen++;
            uint64_t tag = c->user_data & ~0xffffffffull;
            if (tag == TAG_RELAY) on_relay_completion(c);
            else if (tag == TAG_SEND) {
                dropped++;
                to_peer--;
            } else if (tag == TAG_LISTENER) {
                listener_ready = 1;
                if (!(c->flags & IORING_CQE_F_MORE)) arm_listener();
            }
        }
        io_uring_cq_advance(&ring, seen);
        flush_clients();
        if (listener_ready || listener_pending) listener_pending = read_listener();
    }
}

// MARK: - Main

static int print_counters(void) {
    fprintf(stderr, "udp-forward allocations=%u channels=%llu to_peer=%llu to_client=%llu dropped=%llu ignored=%llu\n",
            nallocs, n_channels, to_peer, to_client, dropped, ignored);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--uring") == 0) {
        use_uring = 1;
        argv[1] = argv[0];
        argc--;
        argv++;
    }
    struct forwarder f = forwarder_start(argc, argv, "udp-forward");
    listener = f.listener;
    epfd = f.epfd;
    int sfd = f.sfd;

    for (int k = 0; k < BATCH; k++) {
        liov[k] = (struct iovec){.iov_base = lbuf[k], .iov_len = BUFSIZE};
        lmsg[k].msg_hdr = (struct msghdr){.msg_name = &lname[k], .msg_namelen = sizeof lname[k],
                                          .msg_iov = &liov[k], .msg_iovlen = 1};
        pmsg[k].msg_hdr = (struct msghdr){.msg_name = &pdest[k], .msg_namelen = sizeof pdest[k],
                                          .msg_iov = &piov[k], .msg_iovlen = 1};
        cbuf[k] = cbuf_store[k];
        riov[k] = (struct iovec){.iov_base = cbuf[k] + 4, .iov_len = BUFSIZE};
        rmsg[k].msg_hdr = (struct msghdr){.msg_name = &rname[k], .msg_namelen = sizeof rname[k],
                                          .msg_iov = &riov[k], .msg_iovlen = 1};
        cmsg[k].msg_hdr = (struct msghdr){.msg_name = &cdest[k], .msg_namelen = sizeof cdest[k],
                                          .msg_iov = &ciov[k], .msg_iovlen = 1};
    }
    grow_table();
    if (use_uring) {
        uring_start();
        run_uring(sfd);
        return print_counters();
    }

    struct epoll_event events[256];
    for (int running = 1; running;) {
        int n = epoll_wait(epfd, events, 256, -1);
        if (n < 0 && errno != EINTR) fail("epoll_wait");
        for (int i = 0; i < n; i++) {
            int fd = events[i].data.fd;
            if (fd == listener) read_listener();
            else if (fd == sfd) running = 0;
            else read_relay(fd);
        }
        flush_clients();
    }
    return print_counters();
}
