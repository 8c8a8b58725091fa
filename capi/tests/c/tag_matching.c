/* Tag matching as an MPI library uses it (rdma-core's Documentation/tag_matching.md): the
 * device reports RC tag matching in ibv_query_device_ex; a TM-SRQ made by ibv_create_srq_ex
 * takes tagged buffers through ibv_post_srq_ops (ADD returns a handle, DEL of a consumed tag
 * fails with IBV_WC_TM_ERR, a full list fails with ENOMEM and names the operation); an eager
 * message lands without its TMH and ibv_wc_read_tm_info gives its tag and context; a
 * rendezvous request is read from the sender's buffer and answered with a FIN.
 * Two RC QPs of one device, the receiver's on the TM-SRQ with an extended CQ.
 * Built against rdma-core's headers and run on softrdma's library by capi/tests/apps.rs.
 * Prints "tag matching ok" and exits 0. */
#include <errno.h>
#include <infiniband/tm_types.h>
#include <infiniband/verbs.h>
#include <arpa/inet.h>
#include <endian.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "connect.h"

struct got { uint64_t wr_id; int status, opcode; unsigned flags; uint32_t len; struct ibv_wc_tm_info tm; };

static struct got next_ex(struct ibv_cq_ex *cq)
{
	struct ibv_poll_cq_attr pa = { 0 };
	long i = 0;
	while (ibv_start_poll(cq, &pa) == ENOENT)
		CHECK(++i < 200000000, "a completion on the TM-SRQ's CQ");
	struct got g = { cq->wr_id, cq->status, ibv_wc_read_opcode(cq), ibv_wc_read_wc_flags(cq),
			 ibv_wc_read_byte_len(cq), { 0, 0 } };
	ibv_wc_read_tm_info(cq, &g.tm);
	ibv_end_poll(cq);
	return g;
}

static int post_op(struct ibv_srq *srq, struct ibv_ops_wr *op)
{
	struct ibv_ops_wr *bad = NULL;
	int rc = ibv_post_srq_ops(srq, op, &bad);
	CHECK(rc == 0 || bad == op, "a failed operation is named");
	return rc;
}

static uint32_t add_tag(struct ibv_srq *srq, uint64_t tag, uint64_t id, struct ibv_sge *sge)
{
	struct ibv_ops_wr op = { .wr_id = id, .opcode = IBV_WR_TAG_ADD, .flags = IBV_OPS_SIGNALED };
	op.tm.add.recv_wr_id = id;
	op.tm.add.sg_list = sge;
	op.tm.add.num_sge = 1;
	op.tm.add.tag = tag;
	op.tm.add.mask = ~0ull;
	CHECK(post_op(srq, &op) == 0 && op.tm.handle != 0, "IBV_WR_TAG_ADD and its handle");
	return op.tm.handle;
}

static void send_msg(struct ibv_qp *qp, struct ibv_cq *cq, void *buf, uint32_t len, uint32_t lkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = len, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	CHECK(!ibv_post_send(qp, &wr, &bad), "ibv_post_send");
	CHECK(wait_wc(cq).status == IBV_WC_SUCCESS, "the SEND");
}

int main(void)
{
	struct ibv_device **list;
	struct ibv_device_attr_ex dev;
	struct ibv_context *ctx = open_first(&list, &dev);
	CHECK(dev.tm_caps.flags & IBV_TM_CAP_RC, "RC tag matching offered");
	CHECK(dev.tm_caps.max_num_tags >= 4 && dev.tm_caps.max_rndv_hdr_size >= 32, "tm_caps");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	struct ibv_cq_init_attr_ex cx = { .cqe = 64, .wc_flags = IBV_WC_STANDARD_FLAGS | IBV_WC_EX_WITH_TM_INFO };
	struct ibv_cq_ex *tcq = ibv_create_cq_ex(ctx, &cx);
	CHECK(pd && cq && tcq, "PD and CQs");
	struct ibv_srq_init_attr_ex sa = { .attr = { .max_wr = 16, .max_sge = 1 },
		.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_TM,
		.srq_type = IBV_SRQT_TM, .pd = pd, .cq = ibv_cq_ex_to_cq(tcq), .tm_cap = { .max_num_tags = 4, .max_ops = 8 } };
	struct ibv_srq *srq = ibv_create_srq_ex(ctx, &sa);
	CHECK(srq, "ibv_create_srq_ex(IBV_SRQT_TM)");
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *a = ibv_create_qp(pd, &ia);
	ia.srq = srq;
	ia.recv_cq = ibv_cq_ex_to_cq(tcq);
	ia.cap.max_send_wr = 0;
	struct ibv_qp *b = ibv_create_qp(pd, &ia);
	CHECK(a && b, "a sender and a QP on the TM-SRQ");
	union ibv_gid gid;
	CHECK(!ibv_query_gid(ctx, 1, 0, &gid), "GID 0");
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
	connect_to(a, b->qp_num, &gid, access);
	connect_to(b, a->qp_num, &gid, access);
	static char sbuf[65536], rbuf[65536];
	struct ibv_mr *smr = ibv_reg_mr(pd, sbuf, sizeof sbuf, access), *rmr = ibv_reg_mr(pd, rbuf, sizeof rbuf, access);
	CHECK(smr && rmr, "regions");

	/* Eager: tag 0x42 into rbuf[0..1024). */
	struct ibv_sge tag_sge = { .addr = (uintptr_t)rbuf, .length = 1024, .lkey = rmr->lkey };
	uint32_t handle = add_tag(srq, 0x42, 7, &tag_sge);
	struct got g = next_ex(tcq);
	CHECK(g.opcode == IBV_WC_TM_ADD && g.wr_id == 7 && g.status == IBV_WC_SUCCESS, "IBV_WC_TM_ADD");
	struct ibv_tmh *h = (struct ibv_tmh *)sbuf;
	h->opcode = IBV_TMH_EAGER;
	h->app_ctx = htonl(0xc0ffee);
	h->tag = htobe64(0x42);
	memcpy(sbuf + sizeof *h, "tagged payload", 14);
	send_msg(a, cq, sbuf, sizeof *h + 14, smr->lkey);
	g = next_ex(tcq);
	CHECK(g.opcode == IBV_WC_TM_RECV && g.wr_id == 7 && g.len == 14, "IBV_WC_TM_RECV of the tagged buffer");
	CHECK((g.flags & (IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID)) == (IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID), "matched");
	CHECK(g.tm.tag == 0x42 && g.tm.priv == 0xc0ffee, "ibv_wc_read_tm_info");
	CHECK(!memcmp(rbuf, "tagged payload", 14), "the payload without its TMH");

	/* Deleting the consumed tag fails; a full list refuses ENOMEM. */
	struct ibv_ops_wr del = { .wr_id = 8, .opcode = IBV_WR_TAG_DEL, .flags = IBV_OPS_SIGNALED };
	del.tm.handle = handle;
	CHECK(post_op(srq, &del) == 0 && next_ex(tcq).status == IBV_WC_TM_ERR, "DEL of a consumed tag: IBV_WC_TM_ERR");
	tag_sge.length = 4096;
	for (int i = 0; i < 4; i++) {
		add_tag(srq, 100 + i, 20 + i, &tag_sge);
		CHECK(next_ex(tcq).opcode == IBV_WC_TM_ADD, "ADD");
	}
	struct ibv_ops_wr more = { .wr_id = 30, .opcode = IBV_WR_TAG_ADD };
	more.tm.add.sg_list = &tag_sge;
	more.tm.add.num_sge = 1;
	CHECK(post_op(srq, &more) == ENOMEM, "a full matching list: ENOMEM");

	/* Rendezvous: tag 101 (buffer 21) reads 3000 bytes of sbuf+8192, then a FIN to `a`. */
	for (int i = 0; i < 3000; i++)
		sbuf[8192 + i] = (char)(i * 13);
	struct ibv_sge fin_sge = { .addr = (uintptr_t)sbuf + 60000, .length = 64, .lkey = smr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 55, .sg_list = &fin_sge, .num_sge = 1 }, *rbad;
	CHECK(!ibv_post_recv(a, &rw, &rbad), "a receive for the FIN");
	h->opcode = IBV_TMH_RNDV;
	h->tag = htobe64(101);
	struct ibv_rvh *v = (struct ibv_rvh *)(sbuf + sizeof *h);
	v->va = htobe64((uintptr_t)sbuf + 8192);
	v->rkey = htonl(smr->rkey);
	v->len = htonl(3000);
	send_msg(a, cq, sbuf, sizeof *h + sizeof *v, smr->lkey);
	g = next_ex(tcq);
	CHECK(g.opcode == IBV_WC_TM_RECV && g.wr_id == 21 && (g.flags & IBV_WC_TM_MATCH) && g.tm.tag == 101, "RNDV matched");
	struct ibv_wc fin = wait_wc(cq);
	CHECK(fin.wr_id == 55 && fin.byte_len == 32 && ((struct ibv_tmh *)(sbuf + 60000))->opcode == IBV_TMH_FIN, "the FIN");
	g = next_ex(tcq);
	CHECK(g.wr_id == 21 && g.status == IBV_WC_SUCCESS && (g.flags & IBV_WC_TM_DATA_VALID) && g.len == 3000, "RNDV data");
	CHECK(!memcmp(rbuf, sbuf + 8192, 3000), "the rendezvous data in the tagged buffer");

	CHECK(!ibv_destroy_qp(a) && !ibv_destroy_qp(b) && !ibv_destroy_srq(srq), "teardown");
	ibv_dereg_mr(smr);
	ibv_dereg_mr(rmr);
	ibv_destroy_cq(cq);
	ibv_destroy_cq(ibv_cq_ex_to_cq(tcq));
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	puts("tag matching ok");
	return 0;
}
