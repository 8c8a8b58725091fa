/* What the C test programs share: CHECK, waiting for a completion, and bringing an RC QP to RTS against another QP
 * of the same device (its GID 0), PSN 7 both ways, path MTU 1024, the given access flags. */
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c, what) do { if (!(c)) { fprintf(stderr, "failed: %s\n", what); exit(1); } } while (0)

static inline void connect_to(struct ibv_qp *qp, uint32_t peer_qpn, union ibv_gid *gid, int access)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = access };
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), "INIT");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer_qpn;
	a.rq_psn = 7;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *gid;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER), "RTR");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 7;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 4;
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			     IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC), "RTS");
}

/* The first device, opened, and its extended attributes in `dev`; `*list` for
 * ibv_free_device_list. */
static inline struct ibv_context *open_first(struct ibv_device ***list, struct ibv_device_attr_ex *dev)
{
	int n;
	*list = ibv_get_device_list(&n);
	CHECK(*list && n > 0, "a device");
	struct ibv_context *ctx = ibv_open_device((*list)[0]);
	CHECK(ctx && !ibv_query_device_ex(ctx, NULL, dev), "ibv_query_device_ex");
	return ctx;
}

/* The next completion of `cq`, polled for (a few seconds at most). */
static inline struct ibv_wc wait_wc(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	for (long i = 0; i < 200000000; i++)
		if (ibv_poll_cq(cq, 1, &wc) == 1)
			return wc;
	CHECK(0, "a completion");
	return wc;
}
