/* A plain TCP program: no RDMA in it. `plain_sockets server ADDR PORT` accepts one
 * connection, reads N bytes, checks them and answers their sum; `plain_sockets client
 * ADDR PORT` connects, sends them and checks the answer. Run under librspreload.so, its
 * socket calls become rsockets. Prints "plain sockets: ok" on success. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define N (4 * 1024 * 1024 + 17)

static unsigned char pattern(size_t i) { return (unsigned char)(i * 7 + i / 251); }

static int all(ssize_t (*io)(int, void *, size_t, int), int fd, unsigned char *buf, size_t n) {
    for (size_t done = 0; done < n;) {
        ssize_t r = io(fd, buf + done, n - done, 0);
        if (r <= 0) return -1;
        done += (size_t)r;
    }
    return 0;
}

static ssize_t send_io(int fd, void *b, size_t n, int f) { return send(fd, b, n, f); }
static ssize_t recv_io(int fd, void *b, size_t n, int f) { return recv(fd, b, n, f); }

int main(int argc, char **argv) {
    if (argc != 4) return 2;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[3]))};
    inet_pton(AF_INET, argv[2], &sa.sin_addr);
    unsigned char *buf = malloc(N);
    uint64_t sum = 0, answer = 0;
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (!strcmp(argv[1], "server")) {
        int one = 1;
        setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(s, (struct sockaddr *)&sa, sizeof sa) || listen(s, 1)) { perror("bind/listen"); return 1; }
        int c = accept(s, NULL, NULL);
        if (c < 0 || all(recv_io, c, buf, N)) { perror("accept/recv"); return 1; }
        for (size_t i = 0; i < N; i++) {
            if (buf[i] != pattern(i)) { fprintf(stderr, "byte %zu differs\n", i); return 1; }
            sum += buf[i];
        }
        if (all(send_io, c, (unsigned char *)&sum, sizeof sum)) { perror("send"); return 1; }
        char end;
        recv(c, &end, 1, 0); /* the client's close */
        close(c);
    } else {
        if (connect(s, (struct sockaddr *)&sa, sizeof sa)) { perror("connect"); return 1; }
        for (size_t i = 0; i < N; i++) { buf[i] = pattern(i); sum += buf[i]; }
        if (all(send_io, s, buf, N) || all(recv_io, s, (unsigned char *)&answer, sizeof answer)) {
            perror("send/recv");
            return 1;
        }
        if (answer != sum) { fprintf(stderr, "sum %llu, expected %llu\n", (unsigned long long)answer, (unsigned long long)sum); return 1; }
    }
    close(s);
    printf("plain sockets: ok\n");
    return 0;
}
