/* rdma_cm details applications rely on, each as librdmacm does it: an id bound to a device
 * has the device's PD (id->pd) before any QP, and rdma_create_qp with no PD uses it; a
 * REJECTED event carries the rejecting side's private data; RDMA_OPTION_ID_ACK_TIMEOUT is
 * the QP's Local ACK Timeout (ibv_query_qp) on both sides; an application's own QP
 * (ibv_create_qp, named by qp_num) connects through ids that have none, brought up with
 * rdma_init_qp_attr and rdma_establish, and carries a SEND; and a child forked after its
 * parent used the device connects on its own (a forked process has none of its parent's
 * threads); rdma_destroy_id waits until the application's event thread has acknowledged
 * the id's last event, and drops the events of the id nobody took yet; rdma_create_srq_ex
 * makes a tag-matching SRQ in the id's PD. Built against rdma-core's headers and run on softrdma's library by
 * capi/tests/apps.rs, on the device SOFTRDMA_DEVICES names. Prints "rdma_cm details ok". */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "connect.h"

static struct sockaddr_in server_addr;

/* The next event on `ch`, which must be `type`; its id and status, and a copy of its
 * private data in `data` (NUL-terminated). */
static struct rdma_cm_id *expect(struct rdma_event_channel *ch, enum rdma_cm_event_type type, char *data)
{
	struct rdma_cm_event *e;
	CHECK(!rdma_get_cm_event(ch, &e), "rdma_get_cm_event");
	if (e->event != type)
		fprintf(stderr, "got %s, wanted %s\n", rdma_event_str(e->event), rdma_event_str(type));
	CHECK(e->event == type, "the expected event");
	struct rdma_cm_id *id = e->id;
	if (data) {
		size_t n = e->param.conn.private_data_len;
		memcpy(data, e->param.conn.private_data ? e->param.conn.private_data : "", n);
		data[n] = 0;
	}
	rdma_ack_cm_event(e);
	return id;
}

static void make_qp(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr a = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	CHECK(!rdma_create_qp(id, NULL, &a), "rdma_create_qp");
	CHECK(id->qp->pd == id->pd, "rdma_create_qp with no PD uses id->pd");
}

/* A client id on `ch`, its address and route resolved to the server, with a QP. */
static struct rdma_cm_id *client(struct rdma_event_channel *ch)
{
	struct rdma_cm_id *id;
	CHECK(!rdma_create_id(ch, &id, NULL, RDMA_PS_TCP), "rdma_create_id");
	CHECK(!rdma_resolve_addr(id, NULL, (struct sockaddr *)&server_addr, 2000), "rdma_resolve_addr");
	expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED, NULL);
	CHECK(id->verbs && id->pd, "a resolved id has its device's PD");
	CHECK(!rdma_resolve_route(id, 2000), "rdma_resolve_route");
	expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, NULL);
	make_qp(id);
	return id;
}

static void set_ack_timeout(struct rdma_cm_id *id, uint8_t t)
{
	CHECK(!rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &t, sizeof t), "ACK timeout");
}

static int qp_timeout(struct rdma_cm_id *id)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr i;
	CHECK(!ibv_query_qp(id->qp, &a, IBV_QP_TIMEOUT, &i), "ibv_query_qp");
	return a.timeout;
}

/* Accepts the next request on `ch` (whose ESTABLISHED events follow, the server's and,
 * when `client_too`, the client's, in either order). */
static struct rdma_cm_id *accept_next(struct rdma_event_channel *ch, uint8_t ack_timeout, int client_too)
{
	struct rdma_cm_id *child = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST, NULL);
	make_qp(child);
	set_ack_timeout(child, ack_timeout);
	struct rdma_conn_param p = { .responder_resources = 1, .initiator_depth = 1 };
	CHECK(!rdma_accept(child, &p), "rdma_accept");
	CHECK(qp_timeout(child) == ack_timeout, "the accepting side's QP has the option's timeout");
	for (int i = 0; i < 1 + client_too; i++)
		expect(ch, RDMA_CM_EVENT_ESTABLISHED, NULL);
	return child;
}

/* An RC QP of the application's own on `id`'s device, taken to `state` with what
 * rdma_init_qp_attr says, one state at a time. */
static struct ibv_qp *own_qp(struct rdma_cm_id *id, struct ibv_cq *cq)
{
	struct ibv_qp_init_attr a = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(id->pd, &a);
	CHECK(qp, "ibv_create_qp");
	return qp;
}

static void init_qp_attr_to(struct rdma_cm_id *id, struct ibv_qp *qp, enum ibv_qp_state state)
{
	struct ibv_qp_attr a = { .qp_state = state };
	int mask;
	CHECK(!rdma_init_qp_attr(id, &a, &mask), "rdma_init_qp_attr");
	CHECK(!ibv_modify_qp(qp, &a, mask), "ibv_modify_qp with rdma_init_qp_attr's attributes");
}

/* Both sides with QPs of their own: the client's connect reports CONNECT_RESPONSE, then
 * rdma_establish; the server accepts with its QP's number; a SEND goes across. */
static void external_qps(struct rdma_event_channel *ch)
{
	struct rdma_cm_id *c;
	CHECK(!rdma_create_id(ch, &c, NULL, RDMA_PS_TCP), "rdma_create_id");
	CHECK(!rdma_resolve_addr(c, NULL, (struct sockaddr *)&server_addr, 2000), "rdma_resolve_addr");
	expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED, NULL);
	CHECK(!rdma_resolve_route(c, 2000), "rdma_resolve_route");
	expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, NULL);
	struct ibv_cq *ccq = ibv_create_cq(c->verbs, 8, NULL, NULL, 0);
	CHECK(ccq, "ibv_create_cq");
	struct ibv_qp *cqp = own_qp(c, ccq);
	init_qp_attr_to(c, cqp, IBV_QPS_INIT);
	struct rdma_conn_param p = { .qp_num = cqp->qp_num, .responder_resources = 1, .initiator_depth = 1 };
	CHECK(!rdma_connect(c, &p), "rdma_connect with the application's QP");

	struct rdma_cm_id *child = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST, NULL);
	CHECK(!child->qp, "a request's id has no QP yet");
	struct ibv_cq *scq = ibv_create_cq(child->verbs, 8, NULL, NULL, 0);
	CHECK(scq, "ibv_create_cq");
	struct ibv_qp *sqp = own_qp(child, scq);
	for (enum ibv_qp_state st = IBV_QPS_INIT; st <= IBV_QPS_RTS; st++)
		init_qp_attr_to(child, sqp, st);
	static char buf[64];
	struct ibv_mr *mr = ibv_reg_mr(child->pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr, "ibv_reg_mr");
	struct ibv_sge rsge = { .addr = (uintptr_t)buf + 32, .length = 32, .lkey = mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 1, .sg_list = &rsge, .num_sge = 1 }, *rbad;
	CHECK(!ibv_post_recv(sqp, &rwr, &rbad), "ibv_post_recv");
	struct rdma_conn_param sp = { .qp_num = sqp->qp_num, .responder_resources = 1, .initiator_depth = 1 };
	CHECK(!rdma_accept(child, &sp), "rdma_accept with the application's QP");

	/* CONNECT_RESPONSE (the client's) and ESTABLISHED (the server's), either first. */
	int response = 0, established = 0;
	for (int i = 0; i < 2; i++) {
		struct rdma_cm_event *e;
		CHECK(!rdma_get_cm_event(ch, &e), "rdma_get_cm_event");
		response += e->event == RDMA_CM_EVENT_CONNECT_RESPONSE && e->id == c;
		established += e->event == RDMA_CM_EVENT_ESTABLISHED && e->id == child;
		rdma_ack_cm_event(e);
	}
	CHECK(response == 1 && established == 1, "CONNECT_RESPONSE and ESTABLISHED");
	/* Every state again, as pyverbs' tests do after the response: nothing to undo. */
	for (enum ibv_qp_state st = IBV_QPS_INIT; st <= IBV_QPS_RTS; st++)
		init_qp_attr_to(c, cqp, st);
	CHECK(!rdma_establish(c), "rdma_establish");

	strcpy(buf, "over my own QP");
	struct ibv_sge ssge = { .addr = (uintptr_t)buf, .length = 15, .lkey = mr->lkey };
	struct ibv_send_wr swr = { .wr_id = 2, .sg_list = &ssge, .num_sge = 1, .opcode = IBV_WR_SEND,
				   .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE }, *sbad;
	CHECK(!ibv_post_send(cqp, &swr, &sbad), "ibv_post_send");
	CHECK(wait_wc(ccq).status == IBV_WC_SUCCESS, "the SEND completes");
	struct ibv_wc wc = wait_wc(scq);
	CHECK(wc.status == IBV_WC_SUCCESS && !strcmp(buf + 32, "over my own QP"), "the SEND arrives");
}

static volatile int got, done;

/* An application's event thread: takes one event, is slow to handle it, acknowledges it. */
static void *slow_event_thread(void *ch)
{
	struct rdma_cm_event *e;
	CHECK(!rdma_get_cm_event(ch, &e), "rdma_get_cm_event");
	got = 1;
	usleep(200000);
	done = 1;
	rdma_ack_cm_event(e);
	return NULL;
}

static void destroy_waits_for_acks(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id;
	CHECK(ch && !rdma_create_id(ch, &id, NULL, RDMA_PS_TCP), "rdma_create_id");
	CHECK(!rdma_resolve_addr(id, NULL, (struct sockaddr *)&server_addr, 2000), "rdma_resolve_addr");
	pthread_t t;
	CHECK(!pthread_create(&t, NULL, slow_event_thread, ch), "pthread_create");
	while (!got)
		usleep(1000);
	CHECK(!rdma_destroy_id(id), "rdma_destroy_id");
	CHECK(done, "rdma_destroy_id returned after the event thread acknowledged the id's event");
	pthread_join(t, NULL);
	/* An event nobody took goes with its id. */
	CHECK(!rdma_create_id(ch, &id, NULL, RDMA_PS_TCP), "rdma_create_id");
	CHECK(!rdma_resolve_addr(id, NULL, (struct sockaddr *)&server_addr, 2000), "rdma_resolve_addr");
	usleep(100000);
	CHECK(!rdma_destroy_id(id), "rdma_destroy_id with an event waiting");
	CHECK(!fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK), "non-blocking channel");
	struct rdma_cm_event *e;
	CHECK(rdma_get_cm_event(ch, &e) == -1 && errno == EAGAIN, "no event of a destroyed id");
	rdma_destroy_event_channel(ch);
}

int main(void)
{
	const char *devices = getenv("SOFTRDMA_DEVICES");
	char ip[64];
	CHECK(devices && sscanf(devices, "%*s %*s %63s", ip) == 1, "the device's address");
	server_addr.sin_family = AF_INET;
	server_addr.sin_port = htons(7471);
	CHECK(inet_pton(AF_INET, ip, &server_addr.sin_addr) == 1, "an IPv4 address");

	destroy_waits_for_acks();
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *listener;
	CHECK(ch && !rdma_create_id(ch, &listener, NULL, RDMA_PS_TCP), "the listener's id");
	CHECK(!rdma_bind_addr(listener, (struct sockaddr *)&server_addr), "rdma_bind_addr");
	CHECK(listener->pd, "a bound id has its device's PD");
	/* A tag-matching SRQ through rdma_create_srq_ex, in the id's PD. */
	struct ibv_cq *tcq = ibv_create_cq(listener->verbs, 16, NULL, NULL, 0);
	struct ibv_srq_init_attr_ex sx = { .attr = { .max_wr = 8, .max_sge = 1 },
		.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_TM,
		.srq_type = IBV_SRQT_TM, .cq = tcq, .tm_cap = { .max_num_tags = 8, .max_ops = 8 } };
	CHECK(tcq && !rdma_create_srq_ex(listener, &sx) && listener->srq, "rdma_create_srq_ex(IBV_SRQT_TM)");
	CHECK(sx.pd == listener->pd, "the SRQ is in the id's PD");
	rdma_destroy_srq(listener);
	CHECK(!listener->srq && !ibv_destroy_cq(tcq), "rdma_destroy_srq");
	CHECK(!rdma_listen(listener, 8), "rdma_listen");

	/* Rejected with private data. */
	struct rdma_cm_id *a = client(ch);
	struct rdma_conn_param p = { .private_data = "hello", .private_data_len = 6, .initiator_depth = 1 };
	CHECK(!rdma_connect(a, &p), "rdma_connect");
	struct rdma_cm_id *req = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST, NULL);
	CHECK(!rdma_reject(req, "not now", 8), "rdma_reject");
	char data[256];
	expect(ch, RDMA_CM_EVENT_REJECTED, data);
	CHECK(!strcmp(data, "not now"), "the REJECTED event carries the rejecting side's private data");
	rdma_destroy_id(req);

	/* The ACK timeout option, on both sides. */
	struct rdma_cm_id *b = client(ch);
	set_ack_timeout(b, 9);
	CHECK(!rdma_connect(b, &p), "rdma_connect");
	accept_next(ch, 10, 1);
	CHECK(qp_timeout(b) == 9, "the connecting side's QP has the option's timeout");

	external_qps(ch);

	/* A forked child connects on its own while the parent serves. */
	pid_t pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		struct rdma_event_channel *own = rdma_create_event_channel();
		struct rdma_cm_id *c = client(own);
		CHECK(!rdma_connect(c, &p), "the child's rdma_connect");
		expect(own, RDMA_CM_EVENT_ESTABLISHED, NULL);
		_exit(0);
	}
	accept_next(ch, 12, 0);
	int status;
	CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "the forked child connected");
	printf("rdma_cm details ok\n");
	return 0;
}
