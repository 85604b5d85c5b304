// udp-flood: unauthenticated UDP at line rate against a relay, for the soak's flood
// case (Benchmarks/soak.sh). Each class of traffic leaves from its own sockets, each
// bound to its own source address in 127.0.0.0/8 (so that per-source limits see a
// crowd), and what comes back to a class's sockets is counted as that class's answers:
//
//   binding      Binding requests, 20 bytes, random transaction ids (a real client's)
//   stun         random STUN: a valid header with a random method and class and random
//                attribute bytes (well-formed lengths), 20-120 bytes
//   allocate     Allocate requests without credentials (the 401 challenge path)
//   channel      ChannelData for channels nobody bound (0x4000-0x7FFF), 100 bytes
//   garbage      random bytes with random first bytes, 1-200 bytes
//   initiation   Noise handshake initiations, 152 bytes (to --party only): random
//                content under a valid mac1 when --party-key is given (the responder
//                must then do the DH work or answer with a cookie), else random mac1
//
// usage: udp-flood --target IPV4:PORT [--party IPV4:PORT --party-key BASE64]
//                  [--duration S] [--rate PPS] [--sources N]
//   --rate: datagrams per second over all classes (default 0: as fast as it can)
//   --sources: sockets (source addresses) per class (default 16)
// Prints one line per class and a total: sent, sent_bytes, answers, answer_bytes,
// and the largest answer-to-request byte ratio seen for a single source socket.
// Loopback targets only.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sodium.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BATCH 32
#define MAXLEN 256
#define NCLASSES 6

enum { BINDING, STUN, ALLOCATE, CHANNEL, GARBAGE, INITIATION };
static const char *names[NCLASSES] = {"binding", "stun", "allocate", "channel", "garbage", "initiation"};

struct source {
    int fd;
    unsigned long long sent_bytes, answer_bytes;
};

struct class {
    struct source *sources;
    int n;
    int next;
    unsigned long long sent, sent_bytes, answers, answer_bytes;
    struct sockaddr_in to;
    int enabled;
};

static struct class classes[NCLASSES];
static unsigned char mac1_key[32];
static int have_key;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int parse_address(const char *text, struct sockaddr_in *out) {
    char host[64];
    const char *colon = strrchr(text, ':');
    if (!colon || (size_t)(colon - text) >= sizeof host) return -1;
    memcpy(host, text, (size_t)(colon - text));
    host[colon - text] = 0;
    memset(out, 0, sizeof *out);
    out->sin_family = AF_INET;
    if (inet_pton(AF_INET, host, &out->sin_addr) != 1) return -1;
    long port = strtol(colon + 1, NULL, 10);
    if (port <= 0 || port > 65535) return -1;
    out->sin_port = htons((uint16_t)port);
    if ((ntohl(out->sin_addr.s_addr) >> 24) != 127) return -1;  // loopback only
    return 0;
}

static void put16(unsigned char *p, uint16_t v) { p[0] = (unsigned char)(v >> 8); p[1] = (unsigned char)v; }

static void stun_header(unsigned char *p, uint16_t type, uint16_t length) {
    put16(p, type);
    put16(p + 2, length);
    p[4] = 0x21; p[5] = 0x12; p[6] = 0xA4; p[7] = 0x42;
    randombytes_buf(p + 8, 12);
}

// One datagram of `class` into `p`; returns its length.
static size_t make(int class, unsigned char *p) {
    switch (class) {
    case BINDING:
        stun_header(p, 0x0001, 0);
        return 20;
    case STUN: {
        uint16_t method = (uint16_t)(randombytes_uniform(0x1000));
        uint16_t cls = (uint16_t)randombytes_uniform(4);
        // Method bits M0-M11 around class bits C0 (bit 4) and C1 (bit 8).
        uint16_t type = (uint16_t)((method & 0x000F) | ((method & 0x0070) << 1) | ((method & 0x0F80) << 2)
                                   | ((cls & 1) << 4) | ((cls & 2) << 7));
        size_t length = 0;
        unsigned char *a = p + 20;
        int attributes = (int)randombytes_uniform(4);
        for (int i = 0; i < attributes; i++) {
            uint16_t value = (uint16_t)(4 * randombytes_uniform(6));
            put16(a, (uint16_t)randombytes_uniform(0x10000));
            put16(a + 2, value);
            randombytes_buf(a + 4, value);
            a += 4 + value;
            length += 4 + value;
        }
        stun_header(p, type, (uint16_t)length);
        return 20 + length;
    }
    case ALLOCATE:
        // Allocate with REQUESTED-TRANSPORT UDP, no USERNAME: answered 401 (rate-limited).
        stun_header(p, 0x0003, 8);
        put16(p + 20, 0x0019);
        put16(p + 22, 4);
        p[24] = 17; p[25] = 0; p[26] = 0; p[27] = 0;
        return 28;
    case CHANNEL:
        put16(p, (uint16_t)(0x4000 + randombytes_uniform(0x4000)));
        put16(p + 2, 96);
        randombytes_buf(p + 4, 96);
        return 100;
    case GARBAGE: {
        size_t length = 1 + randombytes_uniform(200);
        randombytes_buf(p, length);
        return length;
    }
    case INITIATION:
        p[0] = 4; p[1] = 0; p[2] = 0; p[3] = 0;
        randombytes_buf(p + 4, 148);
        if (have_key) crypto_generichash(p + 120, 16, p, 120, mac1_key, 32);
        memset(p + 136, 0, 16);  // no mac2: no cookie yet
        return 152;
    }
    return 0;
}

static int open_source(int class, int index) {
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    int size = 1 << 20;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
    struct sockaddr_in from = {0};
    from.sin_family = AF_INET;
    from.sin_addr.s_addr = htonl(0x7F000000u | (uint32_t)(100 + class) << 16 | (uint32_t)(index + 2));
    if (bind(fd, (struct sockaddr *)&from, sizeof from) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

// Reads everything waiting on a class's sockets.
static void drain(struct class *c) {
    static unsigned char buffers[BATCH][2048];
    struct mmsghdr msgs[BATCH];
    struct iovec iov[BATCH];
    for (int s = 0; s < c->n; s++) {
        for (;;) {
            for (int i = 0; i < BATCH; i++) {
                iov[i].iov_base = buffers[i];
                iov[i].iov_len = sizeof buffers[i];
                memset(&msgs[i].msg_hdr, 0, sizeof msgs[i].msg_hdr);
                msgs[i].msg_hdr.msg_iov = &iov[i];
                msgs[i].msg_hdr.msg_iovlen = 1;
            }
            int n = recvmmsg(c->sources[s].fd, msgs, BATCH, MSG_DONTWAIT, NULL);
            if (n <= 0) break;
            for (int i = 0; i < n; i++) {
                c->answers++;
                c->answer_bytes += msgs[i].msg_len;
                c->sources[s].answer_bytes += msgs[i].msg_len;
            }
            if (n < BATCH) break;
        }
    }
}

int main(int argc, char **argv) {
    const char *target = NULL, *party = NULL, *key = NULL;
    double duration = 5, rate = 0;
    int sources = 16;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--target") && i + 1 < argc) target = argv[++i];
        else if (!strcmp(argv[i], "--party") && i + 1 < argc) party = argv[++i];
        else if (!strcmp(argv[i], "--party-key") && i + 1 < argc) key = argv[++i];
        else if (!strcmp(argv[i], "--duration") && i + 1 < argc) duration = atof(argv[++i]);
        else if (!strcmp(argv[i], "--rate") && i + 1 < argc) rate = atof(argv[++i]);
        else if (!strcmp(argv[i], "--sources") && i + 1 < argc) sources = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: udp-flood --target IPV4:PORT [--party IPV4:PORT --party-key BASE64] "
                            "[--duration S] [--rate PPS] [--sources N]\n");
            return 2;
        }
    }
    if (sodium_init() < 0) { fprintf(stderr, "udp-flood: libsodium failed to start\n"); return 1; }
    struct sockaddr_in relay, party_address;
    if (!target || parse_address(target, &relay) < 0 || duration <= 0 || sources < 1 || sources > 250) {
        fprintf(stderr, "udp-flood: --target must be a loopback IPV4:PORT; --duration > 0; --sources 1-250\n");
        return 2;
    }
    if (party && parse_address(party, &party_address) < 0) {
        fprintf(stderr, "udp-flood: --party must be a loopback IPV4:PORT\n");
        return 2;
    }
    if (key) {
        unsigned char public_key[32];
        size_t length = 0;
        if (sodium_base642bin(public_key, sizeof public_key, key, strlen(key), NULL, &length, NULL,
                              sodium_base64_VARIANT_ORIGINAL) != 0 || length != 32) {
            fprintf(stderr, "udp-flood: --party-key must be the relay's public key, 32 bytes of base64\n");
            return 2;
        }
        unsigned char label[8 + 32];
        memcpy(label, "mac1----", 8);
        memcpy(label + 8, public_key, 32);
        crypto_generichash(mac1_key, 32, label, sizeof label, NULL, 0);
        have_key = 1;
    }
    for (int c = 0; c < NCLASSES; c++) {
        classes[c].enabled = c == INITIATION ? party != NULL : 1;
        if (!classes[c].enabled) continue;
        classes[c].to = c == INITIATION ? party_address : relay;
        classes[c].sources = calloc((size_t)sources, sizeof(struct source));
        for (int s = 0; s < sources; s++) {
            int fd = open_source(c, s);
            if (fd < 0) { perror("udp-flood: socket"); return 1; }
            classes[c].sources[classes[c].n++].fd = fd;
        }
    }

    static unsigned char payloads[BATCH][MAXLEN];
    struct mmsghdr msgs[BATCH];
    struct iovec iov[BATCH];
    double start = now(), end = start + duration;
    unsigned long long total = 0;
    int class = 0;
    while (now() < end) {
        if (rate > 0) {
            double due = (now() - start) * rate;
            if ((double)total >= due) {
                for (int c = 0; c < NCLASSES; c++) if (classes[c].enabled) drain(&classes[c]);
                usleep(200);
                continue;
            }
        }
        // One batch from one socket of one class, classes in turn.
        while (!classes[class].enabled) class = (class + 1) % NCLASSES;
        struct class *c = &classes[class];
        struct source *s = &c->sources[c->next];
        c->next = (c->next + 1) % c->n;
        size_t bytes = 0;
        for (int i = 0; i < BATCH; i++) {
            size_t length = make(class, payloads[i]);
            iov[i].iov_base = payloads[i];
            iov[i].iov_len = length;
            memset(&msgs[i].msg_hdr, 0, sizeof msgs[i].msg_hdr);
            msgs[i].msg_hdr.msg_name = &c->to;
            msgs[i].msg_hdr.msg_namelen = sizeof c->to;
            msgs[i].msg_hdr.msg_iov = &iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        int n = sendmmsg(s->fd, msgs, BATCH, MSG_DONTWAIT);
        if (n > 0) {
            for (int i = 0; i < n; i++) bytes += iov[i].iov_len;
            c->sent += (unsigned long long)n;
            c->sent_bytes += bytes;
            s->sent_bytes += bytes;
            total += (unsigned long long)n;
        }
        drain(c);
        class = (class + 1) % NCLASSES;
    }
    usleep(200000);  // answers still on the way
    unsigned long long sent = 0, sent_bytes = 0, answers = 0, answer_bytes = 0;
    double elapsed = now() - start - 0.2;
    for (int c = 0; c < NCLASSES; c++) {
        if (!classes[c].enabled) continue;
        drain(&classes[c]);
        double worst = 0;
        for (int s = 0; s < classes[c].n; s++) {
            struct source *x = &classes[c].sources[s];
            if (x->sent_bytes > 0) {
                double ratio = (double)x->answer_bytes / (double)x->sent_bytes;
                if (ratio > worst) worst = ratio;
            }
        }
        printf("flood class=%s sent=%llu sent_bytes=%llu answers=%llu answer_bytes=%llu worst_source_ratio=%.3f\n",
               names[c], classes[c].sent, classes[c].sent_bytes, classes[c].answers, classes[c].answer_bytes, worst);
        sent += classes[c].sent;
        sent_bytes += classes[c].sent_bytes;
        answers += classes[c].answers;
        answer_bytes += classes[c].answer_bytes;
    }
    printf("flood total sent=%llu pps=%.0f sent_bytes=%llu answers=%llu answer_bytes=%llu ratio=%.3f\n", sent,
           (double)sent / elapsed, sent_bytes, answers, answer_bytes,
           sent_bytes ? (double)answer_bytes / (double)sent_bytes : 0.0);
    return 0;
}
