/* Datagram rsockets: `rsocket_dgram server ADDR PORT` echoes every message back to its
 * sender until it gets one of 1 byte; `rsocket_dgram client SERVER PORT COUNT` sends COUNT
 * messages of sizes 1..1500 with a pattern, checks each echo (content, sender address),
 * then checks what rsockets adds to sockets: MSG_PEEK, rsendto to an address without
 * connecting (the longest message, 2,040 bytes, whole over UDP and over UD), rgetsockname/rgetpeername, a message too big for a slot (EMSGSIZE), and a
 * non-blocking receive with nothing there (EWOULDBLOCK). Prints the round trips' median
 * and worst time. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <rdma/rsocket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A message slot is 2,048 bytes, the header over UD on IPv4 8 of them. */
#define MAX_MESSAGE 2040

#define FAIL(...) do { fprintf(stderr, __VA_ARGS__); fprintf(stderr, " (errno %d: %s)\n", errno, strerror(errno)); exit(1); } while (0)

static struct sockaddr_in addr_of(const char *ip, const char *port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(port))};
    if (inet_pton(AF_INET, ip, &a.sin_addr) != 1) FAIL("bad address %s", ip);
    return a;
}

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int serve(const char *ip, const char *port) {
    int s = rsocket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = addr_of(ip, port);
    if (s < 0 || rbind(s, (struct sockaddr *)&a, sizeof a)) FAIL("server socket");
    char buf[2048];
    for (;;) {
        struct sockaddr_in from;
        socklen_t len = sizeof from;
        ssize_t n = rrecvfrom(s, buf, sizeof buf, 0, (struct sockaddr *)&from, &len);
        if (n < 0) FAIL("rrecvfrom");
        if (len != sizeof from || from.sin_family != AF_INET) FAIL("sender address of %u bytes", len);
        if (rsendto(s, buf, n, 0, (struct sockaddr *)&from, len) != n) FAIL("rsendto");
        if (n == 1) break;
    }
    rclose(s);
    printf("server done\n");
    return 0;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void ping(int s, int count, const struct sockaddr_in *server) {
    char out[1500], in[2048];
    double *rtt = calloc(count, sizeof *rtt);
    for (int i = 0; i < count; i++) {
        int size = 2 + (i * 37) % (sizeof out - 2);
        for (int j = 0; j < size; j++) out[j] = (char)(i + j * 7);
        double t0 = now_us();
        if (rsend(s, out, size, 0) != size) FAIL("rsend %d", i);
        struct sockaddr_in from;
        socklen_t len = sizeof from;
        ssize_t n = rrecvfrom(s, in, sizeof in, 0, (struct sockaddr *)&from, &len);
        rtt[i] = now_us() - t0;
        if (n != size || memcmp(in, out, size)) FAIL("echo %d: %zd bytes of %d, or other bytes", i, n, size);
        if (from.sin_addr.s_addr != server->sin_addr.s_addr || from.sin_port != server->sin_port)
            FAIL("echo %d from another address", i);
    }
    qsort(rtt, count, sizeof *rtt, cmp);
    printf("round trips: %d, median %.2f us, worst %.2f us\n", count, rtt[count / 2], rtt[count - 1]);
    free(rtt);
}

static void extras(int s, const struct sockaddr_in *server, const char *port) {
    char buf[4096], got[4096];
    for (int i = 0; i < MAX_MESSAGE; i++) buf[i] = (char)(i * 13);
    /* A second socket, never connected, sends to the server by address: its first
     * message, the longest one, goes over UDP, the second over UD. */
    int t = rsocket(AF_INET, SOCK_DGRAM, 0);
    for (int i = 0; i < 2; i++) {
        if (t < 0 || rsendto(t, buf, MAX_MESSAGE, 0, (const struct sockaddr *)server, sizeof *server) != MAX_MESSAGE)
            FAIL("rsendto");
        if (rrecv(t, got, sizeof got, MSG_PEEK) != MAX_MESSAGE || rrecv(t, got, sizeof got, 0) != MAX_MESSAGE ||
            memcmp(got, buf, MAX_MESSAGE))
            FAIL("the peeked echo of the longest message");
    }
    struct sockaddr_in name;
    socklen_t len = sizeof name;
    if (rgetsockname(t, (struct sockaddr *)&name, &len) || name.sin_port == 0) FAIL("rgetsockname");
    len = sizeof name;
    if (rgetpeername(s, (struct sockaddr *)&name, &len) || name.sin_port != htons(atoi(port))) FAIL("rgetpeername");
    if (rsend(s, buf, MAX_MESSAGE + 1, 0) != -1 || errno != EMSGSIZE) FAIL("a message bigger than a slot");
    if (rfcntl(t, F_SETFL, O_NONBLOCK) || rrecv(t, got, sizeof got, 0) != -1 || errno != EWOULDBLOCK)
        FAIL("a non-blocking receive with nothing there");
    rclose(t);
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "server")) return serve(argv[2], argv[3]);
    if (argc != 5 || strcmp(argv[1], "client")) return 2;
    struct sockaddr_in server = addr_of(argv[2], argv[3]);
    int s = rsocket(AF_INET, SOCK_DGRAM, 0);
    if (s < 0 || rconnect(s, (struct sockaddr *)&server, sizeof server)) FAIL("client socket");
    ping(s, atoi(argv[4]), &server);
    extras(s, &server, argv[3]);
    if (rsend(s, "x", 1, 0) != 1 || rrecv(s, (char[4]){0}, 4, 0) != 1) FAIL("the last message");
    rclose(s);
    printf("client done\n");
    return 0;
}
