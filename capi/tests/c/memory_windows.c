/* Memory windows as an application uses them: two RC QPs of one device connected to each
 * other; a region that allows binds but no remote access; a type 1 window bound with
 * ibv_bind_mw over part of it takes a WRITE, a type 2 window bound with IBV_WR_BIND_MW takes
 * a READ, then IBV_WR_LOCAL_INV closes it and a READ through it fails with a remote access
 * error. Every completion and byte checked. Built against rdma-core's headers and run on
 * softrdma's library by capi/tests/apps.rs. Prints "memory windows ok" and exits 0. */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "connect.h"

#define LEN 4096

static struct ibv_wc wait_one(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	for (long spins = 0; ibv_poll_cq(cq, 1, &wc) == 0; spins++)
		CHECK(spins < 50000000, "a completion in time");
	return wc;
}

static void expect(struct ibv_cq *cq, uint64_t wr_id, enum ibv_wc_status status, enum ibv_wc_opcode opcode)
{
	struct ibv_wc wc = wait_one(cq);
	if (wc.wr_id != wr_id || wc.status != status || (status == IBV_WC_SUCCESS && wc.opcode != opcode)) {
		fprintf(stderr, "wr_id %llu: %s, opcode %d; wanted wr_id %llu: %s, opcode %d\n",
			(unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status), wc.opcode,
			(unsigned long long)wr_id, ibv_wc_status_str(status), opcode);
		exit(1);
	}
}

static void post(struct ibv_qp *qp, struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad;
	CHECK(!ibv_post_send(qp, wr, &bad), "ibv_post_send");
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0, "a device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	struct ibv_device_attr dev;
	CHECK(ctx && !ibv_query_device(ctx, &dev), "ibv_query_device");
	CHECK(dev.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B && dev.max_mw > 0, "windows offered");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	CHECK(pd && cq, "PD and CQ");
	char *local = aligned_alloc(4096, LEN), *remote = aligned_alloc(4096, LEN);
	memset(local, 0, LEN);
	for (int i = 0; i < LEN; i++)
		remote[i] = (char)(i * 3 + 5);
	struct ibv_mr *lmr = ibv_reg_mr(pd, local, LEN, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *rmr = ibv_reg_mr(pd, remote, LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	CHECK(lmr && rmr, "ibv_reg_mr");
	struct ibv_qp_init_attr qa = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *a = ibv_create_qp(pd, &qa), *b = ibv_create_qp(pd, &qa);
	CHECK(a && b, "ibv_create_qp");
	union ibv_gid gid;
	CHECK(!ibv_query_gid(ctx, 1, 0, &gid), "ibv_query_gid");
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	connect_to(a, b->qp_num, &gid, access);
	connect_to(b, a->qp_num, &gid, access);
	CHECK(!ibv_alloc_mw(pd, 3) && errno == EINVAL, "no window of type 3");

	/* Type 1: 512 bytes at remote + 256, writable. */
	struct ibv_mw *mw1 = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
	CHECK(mw1, "ibv_alloc_mw (type 1)");
	uint32_t before = mw1->rkey;
	struct ibv_mw_bind bind = { .wr_id = 10, .send_flags = IBV_SEND_SIGNALED,
		.bind_info = { .mr = rmr, .addr = (uintptr_t)remote + 256, .length = 512,
			       .mw_access_flags = IBV_ACCESS_REMOTE_WRITE } };
	CHECK(!ibv_bind_mw(b, mw1, &bind), "ibv_bind_mw");
	expect(cq, 10, IBV_WC_SUCCESS, IBV_WC_BIND_MW);
	CHECK(mw1->rkey != before && mw1->rkey >> 8 == before >> 8, "the bind's new key");
	for (int i = 0; i < 512; i++)
		local[i] = (char)(i * 7 + 1);
	struct ibv_sge sge = { .addr = (uintptr_t)local, .length = 512, .lkey = lmr->lkey };
	struct ibv_send_wr wr = { .wr_id = 11, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED };
	wr.wr.rdma.remote_addr = (uintptr_t)remote + 256;
	wr.wr.rdma.rkey = mw1->rkey;
	post(a, &wr);
	expect(cq, 11, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE);
	CHECK(memcmp(remote + 256, local, 512) == 0, "the WRITE through the window");

	/* Type 2: all of the region, readable, bound by a work request. */
	struct ibv_mw *mw2 = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	CHECK(mw2, "ibv_alloc_mw (type 2)");
	uint32_t key2 = ibv_inc_rkey(mw2->rkey);
	struct ibv_send_wr bwr = { .wr_id = 20, .opcode = IBV_WR_BIND_MW, .send_flags = IBV_SEND_SIGNALED };
	bwr.bind_mw.mw = mw2;
	bwr.bind_mw.rkey = key2;
	bwr.bind_mw.bind_info = (struct ibv_mw_bind_info){ .mr = rmr, .addr = (uintptr_t)remote, .length = LEN,
							   .mw_access_flags = IBV_ACCESS_REMOTE_READ };
	post(b, &bwr);
	expect(cq, 20, IBV_WC_SUCCESS, IBV_WC_BIND_MW);
	sge = (struct ibv_sge){ .addr = (uintptr_t)local + 1024, .length = 1024, .lkey = lmr->lkey };
	wr = (struct ibv_send_wr){ .wr_id = 21, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
		.send_flags = IBV_SEND_SIGNALED };
	wr.wr.rdma.remote_addr = (uintptr_t)remote + 2048;
	wr.wr.rdma.rkey = key2;
	post(a, &wr);
	expect(cq, 21, IBV_WC_SUCCESS, IBV_WC_RDMA_READ);
	CHECK(memcmp(local + 1024, remote + 2048, 1024) == 0, "the READ through the window");

	/* Closed by a local invalidation: the next READ through it is refused. */
	struct ibv_send_wr inv = { .wr_id = 22, .opcode = IBV_WR_LOCAL_INV, .send_flags = IBV_SEND_SIGNALED };
	inv.invalidate_rkey = key2;
	post(b, &inv);
	expect(cq, 22, IBV_WC_SUCCESS, IBV_WC_LOCAL_INV);
	wr.wr_id = 23;
	post(a, &wr);
	expect(cq, 23, IBV_WC_REM_ACCESS_ERR, IBV_WC_RDMA_READ);

	CHECK(!ibv_destroy_qp(a) && !ibv_destroy_qp(b), "ibv_destroy_qp");
	CHECK(!ibv_dealloc_mw(mw1) && !ibv_dealloc_mw(mw2), "ibv_dealloc_mw");
	printf("memory windows ok\n");
	return 0;
}
