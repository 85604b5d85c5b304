// room-forward: the machine's limit for room forwarding (parties, issues 15 and 17), the
// baseline Benchmarks/party-relay-bench.sh runs beside `tusa relay --party-port` and a
// coturn mesh with the same load generator (party-load --reference).
//
// It does the per-frame work of the party relay over UDP and nothing else: one read, one
// AEAD open of the sender's hop-by-hop layer, then for every other member of the room one
// AEAD seal under that member's key and one datagram, all sent with sendmmsg. The AEAD is
// the party relay's: ChaCha20-Poly1305 (IETF, libsodium), a 12-byte header as the
// associated data, a 64-bit counter as the nonce. None of the party's checks: no
// handshake (a member's key is derived from its address, below), no replay window, no
// speaker selection, no roster, no rekey, no timers. Single thread, one level-triggered
// epoll set, no per-packet malloc.
//
// Wire format (all of it local to this tool and party-load --reference):
//   join   'J' 0 0 0, room (u32, big-endian)    -> the same 8 bytes back, 'A' first; a
//          member joins one room; joining again (a resend) changes nothing.
//   frame  'M' x y z, counter (u64, big-endian), ciphertext, 16-byte tag; the 12-byte
//          header is the associated data, the nonce is 4 zero bytes and the counter.
//          Each copy goes out in the same format under the recipient's key and counter,
//          x y z as the sender wrote them (party-load's phase tag, readable unopened).
//   key    BLAKE2b-256 (crypto_generichash) of "room-forward" and the member's IPv4
//          address and port, 6 bytes in network order.
//
// usage: room-forward --listen IPV4:PORT    (loopback only; port 0 = any free port)
// prints 'listening IP:PORT' on start; on SIGTERM/SIGINT the counters on stderr, exit 0.
// Counters: dropped = unroutable (a frame from an unknown member, EAGAIN on send);
// failed = a frame whose tag does not open; ignored = anything else.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include "CForwarder.h"
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <sodium.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#define BATCH 64             // messages per recvmmsg / sendmmsg
#define BUDGET 256           // datagrams read per wake
#define BUFSIZE 2048         // per datagram
#define HEADER 12            // 'M' 0 0 0 counter
#define TAG 16
#define MAX_ROOM_MEMBERS 256
#define MAX_ROOMS 65536

struct member {
    uint32_t ip;             // host order
    uint16_t port;
    uint32_t room;
    uint64_t counter;        // of the copies sent to this member
    uint8_t key[32];
};

struct room {
    uint32_t count;
    uint32_t members[MAX_ROOM_MEMBERS];
};

static struct member *members;
static uint32_t nmembers, cap_members;
static uint32_t *table;      // open addressing: member index + 1, 0 = empty
static uint32_t table_mask;
static struct room *rooms[MAX_ROOMS];

static int listener;
static unsigned long long joins, frames, copies, dropped, failed, ignored;

static char lbuf[BATCH][BUFSIZE];
static struct sockaddr_in lname[BATCH];
static struct iovec liov[BATCH];
static struct mmsghdr lmsg[BATCH];

static char obuf[BATCH][BUFSIZE];
static struct sockaddr_in oname[BATCH];
static struct iovec oiov[BATCH];
static struct mmsghdr omsg[BATCH];
static int nout;

static uint8_t plain[BUFSIZE];

static void fail(const char *what) {
    fprintf(stderr, "room-forward: %s: %s\n", what, strerror(errno));
    exit(1);
}

static uint64_t be64(const char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = v << 8 | (uint8_t)p[i];
    return v;
}

static void put64(char *p, uint64_t v) {
    for (int i = 7; i >= 0; i--, v >>= 8) p[i] = (char)v;
}

static uint32_t be32(const char *p) {
    return (uint32_t)(uint8_t)p[0] << 24 | (uint32_t)(uint8_t)p[1] << 16 | (uint32_t)(uint8_t)p[2] << 8 | (uint8_t)p[3];
}

static void nonce_of(uint8_t nonce[12], const char *header) {
    memset(nonce, 0, 4);
    memcpy(nonce + 4, header + 4, 8);
}

// MARK: - Members by address

static uint32_t slot_of(uint32_t ip, uint16_t port) {
    uint64_t key = (uint64_t)ip << 16 | port;
    return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & table_mask;
}

static struct member *find(uint32_t ip, uint16_t port) {
    for (uint32_t s = slot_of(ip, port);; s = (s + 1) & table_mask) {
        if (table[s] == 0) return NULL;
        struct member *m = &members[table[s] - 1];
        if (m->ip == ip && m->port == port) return m;
    }
}

static void insert(uint32_t index) {
    uint32_t s = slot_of(members[index].ip, members[index].port);
    while (table[s] != 0) s = (s + 1) & table_mask;
    table[s] = index + 1;
}

static void grow_table(void) {
    uint32_t size = table ? (table_mask + 1) * 2 : 1024;
    free(table);
    if (!(table = calloc(size, sizeof *table))) fail("calloc");
    table_mask = size - 1;
    for (uint32_t i = 0; i < nmembers; i++) insert(i);
}

static void derive_key(uint8_t key[32], uint32_t ip, uint16_t port) {
    uint8_t input[18] = "room-forward";
    uint32_t nip = htonl(ip);
    uint16_t nport = htons(port);
    memcpy(input + 12, &nip, 4);
    memcpy(input + 16, &nport, 2);
    crypto_generichash(key, 32, input, sizeof input, NULL, 0);
}

// MARK: - Sending

static void flush_out(void) {
    int done = 0;
    while (done < nout) {
        int r = sendmmsg(listener, omsg + done, nout - done, MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                dropped += nout - done;
                break;
            }
            dropped++;  // this message only
            r = 1;
        } else {
            copies += r;
        }
        done += r;
    }
    nout = 0;
}

static void reply(const struct sockaddr_in *to, const char *msg, int len) {
    if (sendto(listener, msg, len, MSG_DONTWAIT, (const struct sockaddr *)to, sizeof *to) < 0) dropped++;
}

// MARK: - Datagrams

static void on_join(const char *p, uint32_t ip, uint16_t port, const struct sockaddr_in *from) {
    uint32_t room = be32(p + 4);
    struct member *m = find(ip, port);
    if (room >= MAX_ROOMS || (m && m->room != room)) {
        ignored++;
        return;
    }
    if (!m) {
        struct room *r = rooms[room];
        if (!r && !(r = rooms[room] = calloc(1, sizeof *r))) fail("calloc");
        if (r->count == MAX_ROOM_MEMBERS) {
            ignored++;
            return;
        }
        if (nmembers == cap_members) {
            cap_members = cap_members ? cap_members * 2 : 1024;
            if (!(members = realloc(members, cap_members * sizeof *members))) fail("realloc");
        }
        members[nmembers] = (struct member){.ip = ip, .port = port, .room = room};
        derive_key(members[nmembers].key, ip, port);
        r->members[r->count++] = nmembers;
        nmembers++;
        if ((uint64_t)nmembers * 2 > table_mask + 1) grow_table();
        else insert(nmembers - 1);
        joins++;
    }
    char ack[8];
    memcpy(ack, p, 8);
    ack[0] = 'A';
    reply(from, ack, 8);
}

static void on_frame(const char *p, int len, uint32_t ip, uint16_t port) {
    struct member *from = find(ip, port);
    if (!from) {
        dropped++;
        return;
    }
    uint8_t nonce[12];
    unsigned long long plen;
    nonce_of(nonce, p);
    if (crypto_aead_chacha20poly1305_ietf_decrypt(plain, &plen, NULL, (const uint8_t *)p + HEADER, len - HEADER,
                                                  (const uint8_t *)p, HEADER, nonce, from->key) != 0) {
        failed++;
        return;
    }
    frames++;
    const struct room *r = rooms[from->room];
    uint32_t self = (uint32_t)(from - members);
    for (uint32_t i = 0; i < r->count; i++) {
        uint32_t k = r->members[i];
        if (k == self) continue;
        struct member *to = &members[k];
        if (nout == BATCH) flush_out();
        char *o = obuf[nout];
        memcpy(o, p, 4);  // 'M' and the sender's bytes 1-3 (the load generator's phase tag)
        put64(o + 4, to->counter++);
        nonce_of(nonce, o);
        unsigned long long clen;
        crypto_aead_chacha20poly1305_ietf_encrypt((uint8_t *)o + HEADER, &clen, plain, plen, (const uint8_t *)o,
                                                  HEADER, NULL, nonce, to->key);
        oname[nout] = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons(to->port)};
        oname[nout].sin_addr.s_addr = htonl(to->ip);
        oiov[nout].iov_len = HEADER + clen;
        nout++;
    }
}

static void on_datagram(const char *p, int len, const struct sockaddr_in *from) {
    uint32_t ip = ntohl(from->sin_addr.s_addr);
    uint16_t port = ntohs(from->sin_port);
    if (len == 8 && p[0] == 'J') return on_join(p, ip, port, from);
    if (len >= HEADER + TAG && len <= BUFSIZE - 64 && p[0] == 'M') return on_frame(p, len, ip, port);
    ignored++;
}

static void read_listener(void) {
    for (int budget = BUDGET; budget > 0; budget -= BATCH) {
        int r = recvmmsg(listener, lmsg, BATCH, MSG_DONTWAIT, NULL);
        if (r <= 0) return;  // EAGAIN (or EINTR: level-triggered epoll brings us back)
        for (int k = 0; k < r; k++) {
            if (lmsg[k].msg_hdr.msg_flags & MSG_TRUNC) ignored++;
            else on_datagram(lbuf[k], (int)lmsg[k].msg_len, &lname[k]);
            lmsg[k].msg_hdr.msg_namelen = sizeof lname[k];
            lmsg[k].msg_hdr.msg_flags = 0;
        }
        flush_out();
        if (r < BATCH) return;
    }
}

// MARK: - Main

int main(int argc, char **argv) {
    if (sodium_init() < 0) {
        fprintf(stderr, "room-forward: libsodium did not initialise\n");
        return 1;
    }
    struct forwarder f = forwarder_start(argc, argv, "room-forward");
    listener = f.listener;

    for (int k = 0; k < BATCH; k++) {
        liov[k] = (struct iovec){.iov_base = lbuf[k], .iov_len = BUFSIZE};
        lmsg[k].msg_hdr = (struct msghdr){.msg_name = &lname[k], .msg_namelen = sizeof lname[k],
                                          .msg_iov = &liov[k], .msg_iovlen = 1};
        oiov[k] = (struct iovec){.iov_base = obuf[k], .iov_len = 0};
        omsg[k].msg_hdr = (struct msghdr){.msg_name = &oname[k], .msg_namelen = sizeof oname[k],
                                          .msg_iov = &oiov[k], .msg_iovlen = 1};
    }
    grow_table();

    struct epoll_event events[8];
    for (int running = 1; running;) {
        int n = epoll_wait(f.epfd, events, 8, -1);
        if (n < 0 && errno != EINTR) fail("epoll_wait");
        for (int i = 0; i < n; i++) {
            if (events[i].data.fd == listener) read_listener();
            else running = 0;
        }
    }
    fprintf(stderr, "room-forward members=%u joins=%llu frames=%llu copies=%llu dropped=%llu failed=%llu ignored=%llu\n",
            nmembers, joins, frames, copies, dropped, failed, ignored);
    return 0;
}
