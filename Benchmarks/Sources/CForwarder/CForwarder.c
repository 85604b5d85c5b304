#define _GNU_SOURCE
#include "CForwarder.h"

#include <arpa/inet.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>

static const char *tool = "forwarder";

static void fail(const char *what) {
    fprintf(stderr, "%s: %s: %s\n", tool, what, strerror(errno));
    exit(1);
}

static int parse_listen(const char *text, struct sockaddr_in *sin) {
    char host[64];
    const char *colon = strrchr(text, ':');
    char *end;
    if (!colon || colon - text >= (long)sizeof host) return 0;
    memcpy(host, text, colon - text);
    host[colon - text] = 0;
    unsigned long port = strtoul(colon + 1, &end, 10);
    *sin = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    return colon[1] && !*end && port <= 65535 && inet_pton(AF_INET, host, &sin->sin_addr) == 1;
}

struct forwarder forwarder_start(int argc, char **argv, const char *name) {
    struct forwarder f;
    tool = name;
    if (argc != 3 || strcmp(argv[1], "--listen") != 0 || !parse_listen(argv[2], &f.address)) {
        fprintf(stderr, "usage: %s --listen IPV4:PORT   (loopback only, port 0 = any)\n", name);
        exit(2);
    }
    if (ntohl(f.address.sin_addr.s_addr) >> 24 != 127) {
        fprintf(stderr, "%s: --listen %s refused: loopback only (127.0.0.0/8)\n", name, argv[2]);
        exit(2);
    }
    // Default actions first: a shell starts background jobs with SIGINT ignored, and an
    // ignored signal never reaches the signalfd.
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGTERM);
    sigaddset(&signals, SIGINT);
    if (sigprocmask(SIG_BLOCK, &signals, NULL) != 0) fail("sigprocmask");
    if ((f.sfd = signalfd(-1, &signals, SFD_CLOEXEC)) < 0) fail("signalfd");

    if ((f.listener = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) < 0) fail("socket");
    int bytes = 4 << 20;
    setsockopt(f.listener, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
    setsockopt(f.listener, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
    socklen_t len = sizeof f.address;
    if (bind(f.listener, (struct sockaddr *)&f.address, sizeof f.address) != 0) fail("bind");
    if (getsockname(f.listener, (struct sockaddr *)&f.address, &len) != 0) fail("getsockname");
    if ((f.epfd = epoll_create1(EPOLL_CLOEXEC)) < 0) fail("epoll_create1");
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = f.listener};
    if (epoll_ctl(f.epfd, EPOLL_CTL_ADD, f.listener, &ev) != 0) fail("epoll_ctl");
    ev.data.fd = f.sfd;
    if (epoll_ctl(f.epfd, EPOLL_CTL_ADD, f.sfd, &ev) != 0) fail("epoll_ctl");

    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &f.address.sin_addr, ip, sizeof ip);
    printf("listening %s:%u\n", ip, ntohs(f.address.sin_port));
    fflush(stdout);
    return f;
}
