/* Raw packet QPs and flow steering as an application uses them: two IBV_QPT_RAW_PACKET
 * QPs of one device brought to RTS with the port only; a rule on the second (Ethernet
 * destination MAC and EtherType, IPv4 addresses, UDP destination port) takes the frames the
 * first sends that match it, whole, and no other; after ibv_destroy_flow nothing comes;
 * tunnel specs are refused with EOPNOTSUPP. Then receive-side scaling: a QP over an
 * indirection table of two work queues, each with its CQ, takes a rule's frames from eight
 * sources, every one completed on one of the two; the table and the queues cannot go while
 * the QP uses them. Built against rdma-core's headers and run on
 * softrdma's library by capi/tests/apps.rs. Prints "raw flow ok" and exits 0. */
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "connect.h"

static const uint8_t DST_MAC[6] = { 0x02, 0x11, 0x22, 0x33, 0x44, 0x55 };
static const uint8_t SRC_MAC[6] = { 0x02, 0x66, 0x77, 0x88, 0x99, 0xaa };

/* An Ethernet/IPv4/UDP frame of 60 bytes to UDP port `port`. */
static size_t build_frame(uint8_t *f, uint16_t port)
{
	memset(f, 0, 60);
	memcpy(f, DST_MAC, 6);
	memcpy(f + 6, SRC_MAC, 6);
	f[12] = 0x08;
	uint8_t ip[20] = { 0x45, 0, 0, 46, 0, 0, 0x40, 0, 64, 17, 0, 0, 192, 168, 1, 2, 192, 168, 1, 1 };
	memcpy(f + 14, ip, 20);
	uint16_t sport = htons(4000), dport = htons(port), ulen = htons(26);
	memcpy(f + 34, &sport, 2);
	memcpy(f + 36, &dport, 2);
	memcpy(f + 38, &ulen, 2);
	for (int i = 42; i < 60; i++)
		f[i] = (uint8_t)i;
	return 60;
}

static void to_rts(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PORT), "INIT with the port");
	a.qp_state = IBV_QPS_RTR;
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE), "RTR");
	a.qp_state = IBV_QPS_RTS;
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE), "RTS");
}

struct rule {
	struct ibv_flow_attr attr;
	struct ibv_flow_spec_eth eth;
	struct ibv_flow_spec_ipv4 ip;
	struct ibv_flow_spec_tcp_udp udp;
};

/* A normal rule on port 1 of `specs` specs, the first on the destination MAC. */
static void eth_rule(struct rule *r, int specs)
{
	memset(r, 0, sizeof(*r));
	r->attr.type = IBV_FLOW_ATTR_NORMAL;
	r->attr.size = sizeof(r->attr) + sizeof(r->eth) + (specs == 3 ? sizeof(r->ip) + sizeof(r->udp) : 0);
	r->attr.num_of_specs = (uint8_t)specs;
	r->attr.port = 1;
	r->eth.type = IBV_FLOW_SPEC_ETH;
	r->eth.size = sizeof(r->eth);
	memcpy(r->eth.val.dst_mac, DST_MAC, 6);
	memset(r->eth.mask.dst_mac, 0xff, 6);
}

static void rss(struct ibv_context *ctx, struct ibv_pd *pd, struct ibv_qp *tx, struct ibv_mr *mr, uint8_t *buf)
{
	struct ibv_cq *cqs[2];
	struct ibv_wq *wqs[2];
	for (int i = 0; i < 2; i++) {
		cqs[i] = ibv_create_cq(ctx, 16, NULL, NULL, 0);
		struct ibv_wq_init_attr wa = { .wq_type = IBV_WQT_RQ, .max_wr = 8, .max_sge = 1, .pd = pd, .cq = cqs[i] };
		wqs[i] = ibv_create_wq(ctx, &wa);
		CHECK(wqs[i], "ibv_create_wq");
		struct ibv_wq_attr st = { .attr_mask = IBV_WQ_ATTR_STATE, .wq_state = IBV_WQS_RDY };
		CHECK(!ibv_modify_wq(wqs[i], &st), "ibv_modify_wq RDY");
		for (int k = 0; k < 8; k++) {
			struct ibv_sge s = { .addr = (uintptr_t)(buf + 1024 + (i * 8 + k) * 128), .length = 128, .lkey = mr->lkey };
			struct ibv_recv_wr r = { .wr_id = (uint64_t)(i * 8 + k), .sg_list = &s, .num_sge = 1 }, *bad;
			CHECK(!ibv_post_wq_recv(wqs[i], &r, &bad), "ibv_post_wq_recv");
		}
	}
	struct ibv_rwq_ind_table_init_attr ta = { .log_ind_tbl_size = 1, .ind_tbl = wqs };
	struct ibv_rwq_ind_table *table = ibv_create_rwq_ind_table(ctx, &ta);
	CHECK(table, "ibv_create_rwq_ind_table");
	uint8_t key[40];
	memset(key, 0x6d, sizeof(key));
	struct ibv_qp_init_attr_ex qa = {
		.qp_type = IBV_QPT_RAW_PACKET, .pd = pd, .rwq_ind_tbl = table,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_IND_TABLE | IBV_QP_INIT_ATTR_RX_HASH,
		.rx_hash_conf = { .rx_hash_function = IBV_RX_HASH_FUNC_TOEPLITZ, .rx_hash_key_len = sizeof(key),
				  .rx_hash_key = key, .rx_hash_fields_mask = IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_DST_IPV4 },
	};
	struct ibv_qp *qp = ibv_create_qp_ex(ctx, &qa);
	CHECK(qp, "ibv_create_qp_ex with an indirection table and a hash");
	struct rule r;
	eth_rule(&r, 1);
	struct ibv_flow *flow = ibv_create_flow(qp, &r.attr);
	CHECK(flow, "a rule on the RSS QP");
	for (int i = 0; i < 8; i++) {
		size_t n = build_frame(buf, 7000);
		buf[26] = (uint8_t)(i * 37);
		struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = (uint32_t)n, .lkey = mr->lkey };
		struct ibv_send_wr wr = { .wr_id = 100 + i, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND }, *bad;
		CHECK(!ibv_post_send(tx, &wr, &bad), "ibv_post_send");
	}
	int got = 0;
	struct ibv_wc wc;
	for (int tries = 0; got < 8 && tries < 1000000; tries++)
		for (int i = 0; i < 2; i++)
			while (ibv_poll_cq(cqs[i], 1, &wc) == 1) {
				CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.byte_len == 60,
				      "each frame completes on a work queue's CQ");
				got++;
			}
	CHECK(got == 8, "every frame reaches a work queue");
	/* Tables are bounded: as many as the device reports, then ENOMEM. */
	struct ibv_device_attr_ex dev;
	CHECK(!ibv_query_device_ex(ctx, NULL, &dev), "ibv_query_device_ex");
	CHECK(dev.rss_caps.rx_hash_function == IBV_RX_HASH_FUNC_TOEPLITZ &&
	      (dev.rss_caps.supported_qpts & (1 << IBV_QPT_RAW_PACKET)), "RSS caps reported");
	uint32_t max = dev.rss_caps.max_rwq_indirection_tables, made = 1;
	struct ibv_rwq_ind_table **more = calloc(max, sizeof(*more));
	while (made < max + 1 && (more[made - 1] = ibv_create_rwq_ind_table(ctx, &ta)))
		made++;
	CHECK(made == max && errno == ENOMEM, "no more tables than rss_caps.max_rwq_indirection_tables");
	for (uint32_t i = 0; i + 1 < made; i++)
		CHECK(!ibv_destroy_rwq_ind_table(more[i]), "destroy the extra tables");
	free(more);
	CHECK(ibv_destroy_rwq_ind_table(table) == EBUSY, "the table stays while its QP does");
	CHECK(!ibv_destroy_flow(flow) && !ibv_destroy_qp(qp), "the RSS QP goes");
	CHECK(!ibv_destroy_rwq_ind_table(table), "then the table");
	for (int i = 0; i < 2; i++)
		CHECK(!ibv_destroy_wq(wqs[i]) && !ibv_destroy_cq(cqs[i]), "then the work queues");
}

int main(void)
{
	struct ibv_device **list;
	struct ibv_device_attr_ex dev;
	struct ibv_context *ctx = open_first(&list, &dev);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RAW_PACKET,
				       .cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *tx = ibv_create_qp(pd, &ia), *rx = ibv_create_qp(pd, &ia);
	CHECK(tx && rx, "ibv_create_qp(IBV_QPT_RAW_PACKET)");
	to_rts(tx);
	to_rts(rx);
	uint8_t *buf = calloc(1, 4096);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr, "ibv_reg_mr");

	struct rule r;
	eth_rule(&r, 3);
	r.eth.val.ether_type = htons(0x0800);
	r.eth.mask.ether_type = 0xffff;
	r.ip.type = IBV_FLOW_SPEC_IPV4;
	r.ip.size = sizeof(r.ip);
	r.ip.val.dst_ip = htonl(0xc0a80101);
	r.ip.mask.dst_ip = 0xffffffff;
	r.udp.type = IBV_FLOW_SPEC_UDP;
	r.udp.size = sizeof(r.udp);
	r.udp.val.dst_port = htons(7000);
	r.udp.mask.dst_port = 0xffff;
	struct ibv_flow *flow = ibv_create_flow(rx, &r.attr);
	CHECK(flow, "ibv_create_flow");

	struct ibv_sge rsge = { .addr = (uintptr_t)(buf + 2048), .length = 2048, .lkey = mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 7, .sg_list = &rsge, .num_sge = 1 }, *rbad;
	CHECK(!ibv_post_recv(rx, &rwr, &rbad), "ibv_post_recv");

	/* A frame to another port: the rule does not take it. Then one it does. */
	size_t n = build_frame(buf, 7001);
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = (uint32_t)n, .lkey = mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	CHECK(!ibv_post_send(tx, &wr, &bad), "ibv_post_send");
	struct ibv_wc wc = wait_wc(cq);
	CHECK(wc.wr_id == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND, "the send completes");
	build_frame(buf, 7000);
	wr.wr_id = 2;
	CHECK(!ibv_post_send(tx, &wr, &bad), "ibv_post_send");
	struct ibv_wc got[2];
	int k = 0;
	for (int tries = 0; k < 2 && tries < 1000000; tries++)
		k += ibv_poll_cq(cq, 2 - k, got + k);
	CHECK(k == 2, "the send and the receive complete");
	struct ibv_wc *recv = got[0].opcode == IBV_WC_RECV ? &got[0] : &got[1];
	CHECK(recv->opcode == IBV_WC_RECV && recv->wr_id == 7 && recv->status == IBV_WC_SUCCESS &&
	      recv->byte_len == n && recv->qp_num == rx->qp_num, "the rule's QP receives the frame");
	CHECK(!memcmp(buf + 2048, buf, n), "whole, headers and all");

	CHECK(!ibv_destroy_flow(flow), "ibv_destroy_flow");
	CHECK(!ibv_post_recv(rx, &rwr, &rbad), "ibv_post_recv");
	wr.wr_id = 3;
	CHECK(!ibv_post_send(tx, &wr, &bad), "ibv_post_send");
	wc = wait_wc(cq);
	CHECK(wc.wr_id == 3, "only the send completes once the rule is gone");
	CHECK(ibv_poll_cq(cq, 1, &wc) == 0, "nothing received");

	struct {
		struct ibv_flow_attr attr;
		struct ibv_flow_spec_tunnel vxlan;
	} t = { 0 };
	t.attr.type = IBV_FLOW_ATTR_NORMAL;
	t.attr.size = sizeof(t);
	t.attr.num_of_specs = 1;
	t.attr.port = 1;
	t.vxlan.type = IBV_FLOW_SPEC_VXLAN_TUNNEL;
	t.vxlan.size = sizeof(t.vxlan);
	CHECK(!ibv_create_flow(rx, &t.attr) && errno == EOPNOTSUPP, "tunnels refused with EOPNOTSUPP");

	rss(ctx, pd, tx, mr, buf);
	CHECK(!ibv_destroy_qp(tx) && !ibv_destroy_qp(rx), "ibv_destroy_qp");
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	puts("raw flow ok");
	return 0;
}
