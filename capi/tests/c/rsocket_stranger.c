/* A client that is not rsockets: it connects to an rsocket listener through rdma_cm with
 * connection data of another protocol (version 0). The listener must refuse it (the client
 * sees a rejection) and go on accepting rsockets. `rsocket_stranger SERVER PORT`. */
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    struct rdma_addrinfo hints = {.ai_port_space = RDMA_PS_TCP}, *res;
    if (rdma_getaddrinfo(argv[1], argv[2], &hints, &res)) { perror("rdma_getaddrinfo"); return 1; }
    struct ibv_qp_init_attr attr = {.cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
                                    .qp_type = IBV_QPT_RC, .sq_sig_all = 1};
    struct rdma_cm_id *id;
    if (rdma_create_ep(&id, res, NULL, &attr)) { perror("rdma_create_ep"); return 1; }
    unsigned char junk[40];
    memset(junk, 0, sizeof junk); /* version 0: not rsockets' */
    struct rdma_conn_param param = {.private_data = junk, .private_data_len = sizeof junk,
                                    .retry_count = 7, .rnr_retry_count = 7};
    int ret = rdma_connect(id, &param);
    if (ret == 0) { fprintf(stderr, "the listener accepted a stranger\n"); return 1; }
    printf("stranger refused: %s\n", strerror(errno));
    rdma_destroy_ep(id);
    rdma_freeaddrinfo(res);
    return 0;
}
