/* The extended post-send API (ibv_create_qp_ex, ibv_qp_to_qp_ex, ibv_wr_*) and the
 * extended CQ (ibv_create_cq_ex, ibv_start_poll / ibv_next_poll / ibv_end_poll, ibv_wc_read_*)
 * as an application uses them: two RC QPs of one device connected to each other; a batch
 * of an RDMA WRITE (SGE), a SEND with inline data and an atomic FETCH_AND_ADD, then a
 * READ back; every completion and every byte checked, with its completion timestamp (the
 * device clock of ibv_query_rt_values_ex) and wall-clock time. Built against rdma-core's headers
 * and run on softrdma's library by capi/tests/apps.rs. Prints "wr api ok" and exits 0. */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "connect.h"

#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)
#define LEN 4096

static struct ibv_qp *make_qp(struct ibv_context *ctx, struct ibv_pd *pd, struct ibv_cq *cq)
{
	struct ibv_qp_init_attr_ex a = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1,
			 .max_inline_data = 64 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = pd,
		.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND |
				  IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD |
				  IBV_QP_EX_WITH_ATOMIC_WRITE,
	};
	struct ibv_qp *qp = ibv_create_qp_ex(ctx, &a);
	CHECK(qp, "ibv_create_qp_ex");
	return qp;
}

/* The completion timestamp of the last completion reaped (the device clock, ns). */
static uint64_t last_ts;

/* Waits for `n` completions through the extended CQ, each a success, and puts their
 * wr_ids in `ids` and byte lengths in `lens`; each one's timestamp follows the one before
 * and its wall-clock time is now, give or take a minute. */
static void reap(struct ibv_cq_ex *cq, int n, uint64_t *ids, uint32_t *lens)
{
	for (int got = 0, spins = 0; got < n; ) {
		struct ibv_poll_cq_attr attr = {};
		int r = ibv_start_poll(cq, &attr);
		if (r == ENOENT) {
			CHECK(++spins < 50000000, "completions in time");
			continue;
		}
		CHECK(r == 0, "ibv_start_poll");
		do {
			if (cq->status != IBV_WC_SUCCESS) {
				fprintf(stderr, "wr_id %llu: %s\n", (unsigned long long)cq->wr_id,
					ibv_wc_status_str(cq->status));
				exit(1);
			}
			CHECK(got < n, "no more completions than requests");
			lens[got] = ibv_wc_read_byte_len(cq);
			ids[got++] = cq->wr_id;
			uint64_t ts = ibv_wc_read_completion_ts(cq);
			CHECK(ts > 0 && ts >= last_ts, "completion timestamps in order");
			last_ts = ts;
			struct timespec now;
			clock_gettime(CLOCK_REALTIME, &now);
			int64_t wall_s = (int64_t)(ibv_wc_read_completion_wallclock_ns(cq) / 1000000000);
			CHECK(wall_s > now.tv_sec - 60 && wall_s <= now.tv_sec, "the wall-clock completion time");
		} while (ibv_next_poll(cq) == 0);
		ibv_end_poll(cq);
	}
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0, "a device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx, "ibv_open_device");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq_init_attr_ex cq_attr = { .cqe = 64,
		.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_QP_NUM | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
			    IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK };
	struct ibv_cq_ex *cqx = ibv_create_cq_ex(ctx, &cq_attr);
	CHECK(pd && cqx, "PD and extended CQ");
	struct ibv_cq *cq = ibv_cq_ex_to_cq(cqx);
	cq_attr.wc_flags = IBV_WC_EX_WITH_CVLAN;
	CHECK(!ibv_create_cq_ex(ctx, &cq_attr) && errno == EOPNOTSUPP, "VLANs are refused");
	struct ibv_device_attr_ex dev_ex;
	CHECK(!ibv_query_device_ex(ctx, NULL, &dev_ex) && dev_ex.hca_core_clock == 1000000, "a 1 GHz device clock");
	char *local = aligned_alloc(4096, LEN), *remote = aligned_alloc(4096, LEN);
	memset(local, 0, LEN);
	memset(remote, 0, LEN);
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
		     IBV_ACCESS_REMOTE_ATOMIC;
	struct ibv_mr *lmr = ibv_reg_mr(pd, local, LEN, access), *rmr = ibv_reg_mr(pd, remote, LEN, access);
	CHECK(lmr && rmr, "ibv_reg_mr");
	struct ibv_qp *a = make_qp(ctx, pd, cq), *b = make_qp(ctx, pd, cq);
	struct ibv_qp_ex *ax = ibv_qp_to_qp_ex(a);
	CHECK(ax, "ibv_qp_to_qp_ex");
	union ibv_gid gid;
	CHECK(!ibv_query_gid(ctx, 1, 0, &gid), "ibv_query_gid");
	connect_to(a, b->qp_num, &gid, ACCESS);
	connect_to(b, a->qp_num, &gid, ACCESS);

	/* The receive for the SEND lands at remote + 2048. */
	struct ibv_sge rsge = { .addr = (uintptr_t)remote + 2048, .length = 64, .lkey = rmr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 100, .sg_list = &rsge, .num_sge = 1 }, *bad;
	CHECK(!ibv_post_recv(b, &rwr, &bad), "ibv_post_recv");

	for (int i = 0; i < 1024; i++)
		local[i] = (char)(i * 7 + 1);
	*(uint64_t *)(remote + 3072) = 40;
	static const char hello[] = "inline hello";

	ibv_wr_start(ax);
	ax->wr_id = 1;
	ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(ax, rmr->rkey, (uintptr_t)remote);
	ibv_wr_set_sge(ax, lmr->lkey, (uintptr_t)local, 1024);
	ax->wr_id = 2;
	ax->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_send(ax);
	char inline_buf[sizeof hello];
	memcpy(inline_buf, hello, sizeof hello);
	ibv_wr_set_inline_data(ax, inline_buf, sizeof hello);
	memset(inline_buf, 'x', sizeof hello); /* the bytes were taken at the call */
	ax->wr_id = 3;
	ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_fetch_add(ax, rmr->rkey, (uintptr_t)remote + 3072, 2);
	ibv_wr_set_sge(ax, lmr->lkey, (uintptr_t)local + 3072, 8);
	CHECK(!ibv_wr_complete(ax), "ibv_wr_complete");

	uint64_t ids[4];
	uint32_t lens[4];
	reap(cqx, 4, ids, lens);
	for (int i = 0; i < 4; i++)
		if (ids[i] == 100)
			CHECK(lens[i] == sizeof hello, "the receive's byte length");
	CHECK(memcmp(remote, local, 1024) == 0, "the WRITE's bytes");
	CHECK(strcmp(remote + 2048, hello) == 0, "the inline SEND's bytes");
	CHECK(*(uint64_t *)(local + 3072) == 40, "FETCH_AND_ADD returns the old value");
	CHECK(*(uint64_t *)(remote + 3072) == 42, "FETCH_AND_ADD adds");

	/* READ back into a fresh stretch; an aborted batch posts nothing. */
	ibv_wr_start(ax);
	ax->wr_id = 9;
	ibv_wr_send(ax);
	ibv_wr_set_sge(ax, lmr->lkey, (uintptr_t)local, 8);
	ibv_wr_abort(ax);
	ibv_wr_start(ax);
	ax->wr_id = 4;
	ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_read(ax, rmr->rkey, (uintptr_t)remote);
	ibv_wr_set_sge(ax, lmr->lkey, (uintptr_t)local + 1024, 1024);
	CHECK(!ibv_wr_complete(ax), "ibv_wr_complete (READ)");
	reap(cqx, 1, ids, lens);
	CHECK(ids[0] == 4 && lens[0] == 1024, "the READ completes, not the aborted SEND");
	CHECK(memcmp(local + 1024, local, 1024) == 0, "the READ's bytes");
	struct ibv_values_ex values = { .comp_mask = IBV_VALUES_MASK_RAW_CLOCK };
	CHECK(!ibv_query_rt_values_ex(ctx, &values), "ibv_query_rt_values_ex");
	uint64_t raw = (uint64_t)values.raw_clock.tv_sec * 1000000000 + (uint64_t)values.raw_clock.tv_nsec;
	CHECK(raw >= last_ts, "the device clock runs on from the last completion");

	/* ATOMIC WRITE: 8 bytes, taken at the call, stored at once at an aligned address. */
	ibv_wr_start(ax);
	ax->wr_id = 6;
	ax->wr_flags = IBV_SEND_SIGNALED;
	uint64_t word = 0x1122334455667788ull;
	ibv_wr_atomic_write(ax, rmr->rkey, (uintptr_t)remote + 3080, &word);
	word = 0;
	CHECK(!ibv_wr_complete(ax), "ibv_wr_complete (ATOMIC WRITE)");
	reap(cqx, 1, ids, lens);
	CHECK(ids[0] == 6 && *(uint64_t *)(remote + 3080) == 0x1122334455667788ull, "ATOMIC WRITE stores its word");

	/* An operation softrdma does not do fails the batch, posting nothing. */
	ibv_wr_start(ax);
	ax->wr_id = 5;
	char hdr[64] = { 0 };
	ibv_wr_send_tso(ax, hdr, sizeof hdr, 1024);
	CHECK(ibv_wr_complete(ax) == EOPNOTSUPP, "TSO is refused");
	struct ibv_poll_cq_attr attr = {};
	CHECK(ibv_start_poll(cqx, &attr) == ENOENT, "nothing posted");

	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_dereg_mr(lmr);
	ibv_dereg_mr(rmr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	puts("wr api ok");
	return 0;
}
