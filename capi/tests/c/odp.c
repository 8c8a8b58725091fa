/* On-demand paging as an application uses it: the device reports ODP (implicit included)
 * in ibv_query_device_ex; an explicit ODP region over an mmap'd buffer is prefetched with
 * ibv_advise_mr and takes a WRITE; an implicit region (NULL, SIZE_MAX) takes a WRITE into
 * memory mapped after it was registered; a WRITE through it to a page made inaccessible
 * meanwhile (PROT_NONE: unmapping it, the engine's own threads could map the address again
 * at once) fails with a remote access error rather than faulting the process; prefetching
 * it fails with EFAULT when synchronous; moved by ibv_rereg_mr, an explicit region stays on
 * demand and refuses such a page too. Two RC QPs of one device.
 * Built against rdma-core's headers and run on softrdma's library by capi/tests/apps.rs.
 * Prints "odp ok" and exits 0. */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "connect.h"

#define PAGE 4096

static void *map_pages(int n)
{
	void *p = mmap(NULL, (size_t)n * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(p != MAP_FAILED, "mmap");
	return p;
}

/* WRITE `len` bytes of `src` (lkey `lkey`) to `dst` under `rkey`; the completion's status. */
static enum ibv_wc_status write_to(struct ibv_qp *qp, struct ibv_cq *cq, void *src, uint32_t lkey, uint32_t len,
				   void *dst, uint32_t rkey, uint64_t id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)src, .length = len, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.wr.rdma.remote_addr = (uintptr_t)dst;
	wr.wr.rdma.rkey = rkey;
	CHECK(!ibv_post_send(qp, &wr, &bad), "ibv_post_send");
	struct ibv_wc wc = wait_wc(cq);
	CHECK(wc.wr_id == id, "the WRITE's completion");
	return wc.status;
}

int main(void)
{
	struct ibv_device **list;
	struct ibv_device_attr_ex dev;
	struct ibv_context *ctx = open_first(&list, &dev);
	CHECK(dev.odp_caps.general_caps & IBV_ODP_SUPPORT, "ODP offered");
	CHECK(dev.odp_caps.general_caps & IBV_ODP_SUPPORT_IMPLICIT, "implicit ODP offered");
	uint32_t rc = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ;
	CHECK((dev.odp_caps.per_transport_caps.rc_odp_caps & rc) == rc, "ODP on RC");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	CHECK(pd && cq, "PD and CQ");
	struct ibv_qp_init_attr init = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
					 .cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *a = ibv_create_qp(pd, &init), *b = ibv_create_qp(pd, &init);
	CHECK(a && b, "two QPs");
	union ibv_gid gid;
	CHECK(!ibv_query_gid(ctx, 1, 0, &gid), "GID 0");
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	connect_to(a, b->qp_num, &gid, access);
	connect_to(b, a->qp_num, &gid, access);

	char *src = map_pages(1);
	for (int i = 0; i < PAGE; i++)
		src[i] = (char)(i * 7 + 1);
	struct ibv_mr *smr = ibv_reg_mr(pd, src, PAGE, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
	CHECK(smr, "an explicit ODP region");
	char *dst = map_pages(2);
	struct ibv_mr *dmr = ibv_reg_mr(pd, dst, 2 * PAGE, access | IBV_ACCESS_ON_DEMAND);
	CHECK(dmr, "an explicit ODP target");
	struct ibv_sge pre = { .addr = (uintptr_t)dst, .length = 2 * PAGE, .lkey = dmr->lkey };
	CHECK(!ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH, &pre, 1), "prefetch");
	CHECK(write_to(a, cq, src, smr->lkey, PAGE, dst + 100, dmr->rkey, 1) == IBV_WC_SUCCESS, "WRITE into ODP");
	CHECK(!memcmp(dst + 100, src, PAGE), "the bytes landed across the page boundary");

	struct ibv_mr *all = ibv_reg_mr(pd, NULL, SIZE_MAX, access | IBV_ACCESS_ON_DEMAND);
	CHECK(all && all->length == SIZE_MAX, "an implicit ODP region");
	char *later = map_pages(1);
	CHECK(write_to(a, cq, src, smr->lkey, 64, later, all->rkey, 2) == IBV_WC_SUCCESS, "WRITE via implicit ODP");
	CHECK(!memcmp(later, src, 64), "placed in memory mapped after the registration");
	CHECK(!mprotect(later, PAGE, PROT_NONE), "mprotect");
	struct ibv_sge gone = { .addr = (uintptr_t)later, .length = 64, .lkey = all->lkey };
	CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_FLAG_FLUSH, &gone, 1) == EFAULT,
	      "a synchronous prefetch of nothing mapped fails");
	CHECK(!ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT, 0, &gone, 1), "NO_FAULT faults nothing in");
	CHECK(write_to(a, cq, src, smr->lkey, 64, later, all->rkey, 3) == IBV_WC_REM_ACCESS_ERR,
	      "a WRITE to an inaccessible page is refused");

	/* Moved by ibv_rereg_mr, an on-demand region stays one: the page it moves to is not
	 * accessible, and a WRITE there is refused rather than faulting the process. */
	struct ibv_qp_attr reset = { .qp_state = IBV_QPS_RESET };
	CHECK(!ibv_modify_qp(a, &reset, IBV_QP_STATE) && !ibv_modify_qp(b, &reset, IBV_QP_STATE), "reset after the error");
	connect_to(a, b->qp_num, &gid, access);
	connect_to(b, a->qp_num, &gid, access);
	CHECK(!ibv_rereg_mr(dmr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, later, PAGE, 0), "ibv_rereg_mr");
	CHECK(write_to(a, cq, src, smr->lkey, 64, later, dmr->rkey, 4) == IBV_WC_REM_ACCESS_ERR,
	      "a re-registered on-demand region refuses an inaccessible page");
	CHECK(!ibv_dereg_mr(all) && !ibv_dereg_mr(dmr) && !ibv_dereg_mr(smr), "dereg");
	CHECK(!ibv_destroy_qp(a) && !ibv_destroy_qp(b), "destroy QPs");
	CHECK(!ibv_destroy_cq(cq) && !ibv_dealloc_pd(pd), "destroy CQ and PD");
	CHECK(!ibv_close_device(ctx), "close");
	ibv_free_device_list(list);
	puts("odp ok");
	return 0;
}
