/* Thread and parent domains as UCX and rdma-core's tests use them: a thread domain, a
 * parent domain over a PD with that thread domain, custom allocators and a context; an
 * extended CQ made in the parent domain; a region and two RC QPs made in it, and a SEND
 * between them. A parent of a parent domain, and a CQ whose "parent domain" is a plain PD,
 * are refused with EINVAL. Built against rdma-core's headers and run on softrdma's library
 * by capi/tests/apps.rs. Prints "parent domain ok" and exits 0. */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "connect.h"

static void *alloc_cb(struct ibv_pd *pd, void *pd_context, size_t size, size_t alignment, uint64_t type)
{
	(void)pd, (void)pd_context, (void)size, (void)alignment, (void)type;
	return IBV_ALLOCATOR_USE_DEFAULT;
}

static void free_cb(struct ibv_pd *pd, void *pd_context, void *ptr, uint64_t type)
{
	(void)pd, (void)pd_context, (void)ptr, (void)type;
}

int main(void)
{
	struct ibv_device **list;
	struct ibv_device_attr_ex dev;
	struct ibv_context *ctx = open_first(&list, &dev);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_td_init_attr tdi = { 0 };
	struct ibv_td *td = ibv_alloc_td(ctx, &tdi);
	CHECK(pd && td, "PD and thread domain");
	int cookie = 7;
	struct ibv_parent_domain_init_attr pa = {
		.pd = pd, .td = td, .alloc = alloc_cb, .free = free_cb, .pd_context = &cookie,
		.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT,
	};
	struct ibv_pd *parent = ibv_alloc_parent_domain(ctx, &pa);
	CHECK(parent && parent->context == ctx, "a parent domain");
	struct ibv_parent_domain_init_attr nested = { .pd = parent };
	CHECK(!ibv_alloc_parent_domain(ctx, &nested) && errno == EINVAL, "no parent of a parent domain");

	struct ibv_cq_init_attr_ex cqa = { .cqe = 16, .wc_flags = IBV_WC_STANDARD_FLAGS,
					   .comp_mask = IBV_CQ_INIT_ATTR_MASK_PD, .parent_domain = pd };
	CHECK(!ibv_create_cq_ex(ctx, &cqa) && errno == EINVAL, "a CQ's parent domain must be one");
	cqa.parent_domain = parent;
	struct ibv_cq_ex *cqx = ibv_create_cq_ex(ctx, &cqa);
	CHECK(cqx, "an extended CQ in the parent domain");
	struct ibv_cq *cq = ibv_cq_ex_to_cq(cqx);

	char *buf = calloc(1, 4096);
	struct ibv_mr *mr = ibv_reg_mr(parent, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr && mr->pd == parent, "a region in the parent domain");
	struct ibv_qp_init_attr qa = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *a = ibv_create_qp(parent, &qa), *b = ibv_create_qp(parent, &qa);
	CHECK(a && b && a->pd == parent, "QPs in the parent domain");
	union ibv_gid gid;
	CHECK(!ibv_query_gid(ctx, 1, 0, &gid), "GID 0");
	connect_to(a, b->qp_num, &gid, IBV_ACCESS_LOCAL_WRITE);
	connect_to(b, a->qp_num, &gid, IBV_ACCESS_LOCAL_WRITE);
	strcpy(buf, "through a parent domain");
	struct ibv_sge rs = { .addr = (uintptr_t)(buf + 2048), .length = 64, .lkey = mr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 1, .sg_list = &rs, .num_sge = 1 }, *rbad;
	CHECK(!ibv_post_recv(b, &rw, &rbad), "post_recv");
	struct ibv_sge ss = { .addr = (uintptr_t)buf, .length = 24, .lkey = mr->lkey };
	struct ibv_send_wr sw = { .wr_id = 2, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *sbad;
	CHECK(!ibv_post_send(a, &sw, &sbad), "post_send");
	for (int seen = 0; seen < 2; seen++) {
		struct ibv_wc wc = wait_wc(cq);
		CHECK(wc.status == IBV_WC_SUCCESS, "completions succeed");
	}
	CHECK(!strcmp(buf + 2048, "through a parent domain"), "the SEND landed");

	CHECK(!ibv_destroy_qp(a) && !ibv_destroy_qp(b) && !ibv_dereg_mr(mr), "destroy QPs and region");
	CHECK(!ibv_destroy_cq(cq), "destroy CQ");
	CHECK(!ibv_dealloc_pd(parent) && !ibv_dealloc_td(td) && !ibv_dealloc_pd(pd), "free the domains");
	CHECK(!ibv_close_device(ctx), "close");
	ibv_free_device_list(list);
	free(buf);
	puts("parent domain ok");
	return 0;
}
