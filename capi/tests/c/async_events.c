/* Asynchronous events as an application meets them (ibv_get_async_event,
 * ibv_ack_async_event, the context's async_fd under poll): two RC QPs of one device
 * connected to each other, the receiver's on a shared receive queue. Its armed limit
 * raises IBV_EVENT_SRQ_LIMIT_REACHED; an RDMA WRITE with a wrong rkey takes the receiver
 * to ERR with IBV_EVENT_QP_ACCESS_ERR, then IBV_EVENT_QP_LAST_WQE_REACHED (it is on an
 * SRQ), while the sender learns of it from its completion only. Built against rdma-core's
 * headers and run on softrdma's library by capi/tests/apps.rs. Prints "async events ok". */
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "connect.h"

#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)
#define LEN 4096

static struct ibv_qp *make_qp(struct ibv_pd *pd, struct ibv_cq *cq, struct ibv_srq *srq)
{
	struct ibv_qp_init_attr a = {
		.send_cq = cq, .recv_cq = cq, .srq = srq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &a);
	CHECK(qp, "ibv_create_qp");
	return qp;
}

/* The next event, waiting for async_fd under poll as an application's event loop does. */
static struct ibv_async_event next_event(struct ibv_context *ctx)
{
	struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
	CHECK(poll(&p, 1, 5000) == 1 && (p.revents & POLLIN), "async_fd readable");
	struct ibv_async_event e;
	CHECK(!ibv_get_async_event(ctx, &e), "ibv_get_async_event");
	return e;
}

static void send_one(struct ibv_qp *qp, struct ibv_mr *mr, uint64_t id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)mr->addr, .length = 8, .lkey = mr->lkey };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	CHECK(!ibv_post_send(qp, &wr, &bad), "ibv_post_send");
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0, "a device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx, "ibv_open_device");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *scq = ibv_create_cq(ctx, 64, NULL, NULL, 0), *rcq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 8, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(pd, &sa);
	CHECK(pd && scq && rcq && srq, "PD, CQs, SRQ");
	char *buf = aligned_alloc(4096, LEN);
	memset(buf, 0, LEN);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(mr, "ibv_reg_mr");
	struct ibv_qp *a = make_qp(pd, scq, NULL), *b = make_qp(pd, rcq, srq);
	union ibv_gid gid;
	CHECK(!ibv_query_gid(ctx, 1, 0, &gid), "ibv_query_gid");
	connect_to(a, b->qp_num, &gid, ACCESS);
	connect_to(b, a->qp_num, &gid, ACCESS);

	/* Nothing yet: a non-blocking async_fd answers EAGAIN. */
	int flags = fcntl(ctx->async_fd, F_GETFL);
	CHECK(fcntl(ctx->async_fd, F_SETFL, flags | O_NONBLOCK) == 0, "O_NONBLOCK");
	struct ibv_async_event e;
	CHECK(ibv_get_async_event(ctx, &e) == -1 && errno == EAGAIN, "no event yet");

	/* Four receives, the limit armed at 3: two SENDs leave 2, below it. */
	for (int i = 0; i < 4; i++) {
		struct ibv_sge s = { .addr = (uintptr_t)buf + 1024 + 64 * i, .length = 64, .lkey = mr->lkey };
		struct ibv_recv_wr r = { .wr_id = 10 + i, .sg_list = &s, .num_sge = 1 }, *bad;
		CHECK(!ibv_post_srq_recv(srq, &r, &bad), "ibv_post_srq_recv");
	}
	struct ibv_srq_attr lim = { .srq_limit = 3 };
	CHECK(!ibv_modify_srq(srq, &lim, IBV_SRQ_LIMIT), "arm the limit");
	send_one(a, mr, 1);
	CHECK(wait_wc(rcq).status == IBV_WC_SUCCESS && wait_wc(scq).status == IBV_WC_SUCCESS, "first SEND");
	struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
	CHECK(poll(&p, 1, 50) == 0, "3 left is not below the limit");
	send_one(a, mr, 2);
	CHECK(wait_wc(rcq).status == IBV_WC_SUCCESS && wait_wc(scq).status == IBV_WC_SUCCESS, "second SEND");
	e = next_event(ctx);
	CHECK(e.event_type == IBV_EVENT_SRQ_LIMIT_REACHED && e.element.srq == srq, "SRQ limit reached");
	ibv_ack_async_event(&e);
	CHECK(srq->events_completed == 1, "the ack is counted on the SRQ");
	struct ibv_srq_attr now;
	CHECK(!ibv_query_srq(srq, &now) && now.srq_limit == 0, "the limit is disarmed");

	/* A WRITE with a wrong rkey: the receiver NAKs it and goes to ERR. */
	struct ibv_sge s = { .addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey };
	struct ibv_send_wr w = { .wr_id = 3, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				 .send_flags = IBV_SEND_SIGNALED,
				 .wr.rdma = { .remote_addr = (uintptr_t)buf + 512, .rkey = mr->rkey ^ 0x80 } }, *bad;
	CHECK(!ibv_post_send(a, &w, &bad), "the bad WRITE posts");
	CHECK(wait_wc(scq).status == IBV_WC_REM_ACCESS_ERR, "the sender's completion says why");
	e = next_event(ctx);
	CHECK(e.event_type == IBV_EVENT_QP_ACCESS_ERR && e.element.qp == b, "the receiver's access error");
	ibv_ack_async_event(&e);
	e = next_event(ctx);
	CHECK(e.event_type == IBV_EVENT_QP_LAST_WQE_REACHED && e.element.qp == b, "last WQE reached");
	ibv_ack_async_event(&e);
	CHECK(b->events_completed == 2 && a->events_completed == 0, "acks counted on the QP");
	CHECK(ibv_get_async_event(ctx, &e) == -1 && errno == EAGAIN, "nothing else: the sender gets no event");

	CHECK(!ibv_destroy_qp(a) && !ibv_destroy_qp(b) && !ibv_destroy_srq(srq), "destroy QPs, SRQ");
	CHECK(!ibv_dereg_mr(mr) && !ibv_destroy_cq(scq) && !ibv_destroy_cq(rcq), "MR, CQs");
	CHECK(!ibv_dealloc_pd(pd) && !ibv_close_device(ctx), "PD, context");
	ibv_free_device_list(list);
	free(buf);
	printf("async events ok\n");
	return 0;
}
