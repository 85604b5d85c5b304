// The start of the C reference forwarders (udp-forward, room-forward): their one
// option, the signals that stop them, the listening socket and the epoll set.
#ifndef CFORWARDER_H
#define CFORWARDER_H

#include <netinet/in.h>

struct forwarder {
    int listener;   // non-blocking UDP socket, 4 MiB buffers each way
    int epfd;       // level-triggered epoll set holding the listener and the signals
    int sfd;        // signalfd of SIGTERM and SIGINT: readable means stop
    struct sockaddr_in address;  // where the listener is bound
};

/// Parses `--listen IPV4:PORT` (loopback only; port 0 = any free port), turns
/// SIGTERM and SIGINT into `sfd`, binds the listener, puts both in `epfd` (the
/// epoll data is the descriptor) and prints 'listening IP:PORT'. A usage error
/// exits 2 and a failed system call exits 1, each with a line on stderr naming `name`.
struct forwarder forwarder_start(int argc, char **argv, const char *name);

#endif
