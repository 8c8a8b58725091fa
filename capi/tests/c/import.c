/* Importing objects into a second context of the same process, as rdma-core's shared-PD
 * users do: ibv_import_device on a dup of a context's cmd_fd opens the same device;
 * ibv_import_pd, ibv_import_mr and ibv_import_dm give the same PD, region and device
 * memory by handle; a QP of the imported context, in the imported PD, WRITEs from the
 * imported region into the original one; a region imported cannot be re-registered
 * (EBUSY); unimporting leaves the originals working; a
 * descriptor that is no context's, and a handle that is no object's, are refused.
 * Built against rdma-core's headers and run on softrdma's library by capi/tests/apps.rs.
 * Prints "import ok" and exits 0. */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "connect.h"

int main(void)
{
	struct ibv_device **list;
	struct ibv_device_attr_ex dev;
	struct ibv_context *ctx = open_first(&list, &dev);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	static char src[4096], dst[4096];
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	struct ibv_mr *smr = ibv_reg_mr(pd, src, sizeof src, access), *dmr = ibv_reg_mr(pd, dst, sizeof dst, access);
	CHECK(pd && smr && dmr && pd->handle && smr->handle != dmr->handle, "a PD and regions with handles");

	struct ibv_context *ictx = ibv_import_device(dup(ctx->cmd_fd));
	CHECK(ictx, "ibv_import_device on a dup of cmd_fd");
	struct ibv_pd *ipd = ibv_import_pd(ictx, pd->handle);
	struct ibv_mr *imr = ibv_import_mr(ipd, smr->handle);
	CHECK(ipd && ipd->handle == pd->handle && imr, "the PD and region imported");
	CHECK(imr->lkey == smr->lkey && imr->rkey == smr->rkey && imr->addr == smr->addr && imr->length == smr->length,
	      "the imported region is the same region");
	CHECK(!ibv_import_mr(ipd, 0x7fffffff) && errno == ENOENT, "a handle of no region");
	CHECK(ibv_rereg_mr(smr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, access) == IBV_REREG_MR_ERR_CMD &&
	      errno == EBUSY, "an imported region cannot change under its importer");
	int pipefd[2];
	CHECK(!pipe(pipefd) && !ibv_import_device(pipefd[0]) && errno == EOPNOTSUPP, "a descriptor of no context");

	/* A QP of the imported context, in the imported PD, writes from the imported region. */
	struct ibv_cq *cq = ibv_create_cq(ictx, 16, NULL, NULL, 0), *ocq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *a = ibv_create_qp(ipd, &ia);
	ia.send_cq = ia.recv_cq = ocq;
	struct ibv_qp *b = ibv_create_qp(pd, &ia);
	CHECK(cq && ocq && a && b, "QPs on both contexts");
	union ibv_gid gid;
	CHECK(!ibv_query_gid(ctx, 1, 0, &gid), "GID 0");
	connect_to(a, b->qp_num, &gid, access);
	connect_to(b, a->qp_num, &gid, access);
	memcpy(src, "through the imported region", 28);
	struct ibv_sge sge = { .addr = (uintptr_t)src, .length = 28, .lkey = imr->lkey };
	struct ibv_send_wr wr = { .wr_id = 3, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.wr.rdma.remote_addr = (uintptr_t)dst;
	wr.wr.rdma.rkey = dmr->rkey;
	CHECK(!ibv_post_send(a, &wr, &bad) && wait_wc(cq).status == IBV_WC_SUCCESS, "the WRITE");
	CHECK(!memcmp(dst, "through the imported region", 28), "the data in the original region");

	/* Device memory, written through the original and read through the import. */
	struct ibv_alloc_dm_attr da = { .length = 64 };
	struct ibv_dm *dm = ibv_alloc_dm(ctx, &da);
	CHECK(dm, "ibv_alloc_dm");
	struct ibv_dm *idm = ibv_import_dm(ictx, dm->handle);
	CHECK(idm, "ibv_import_dm");
	uint32_t words[16], back[16] = { 0 };
	for (int i = 0; i < 16; i++)
		words[i] = 0x5a000000u + (uint32_t)i;
	CHECK(!ibv_memcpy_to_dm(dm, 0, words, sizeof words) && !ibv_memcpy_from_dm(back, idm, 0, sizeof back),
	      "copies through both");
	CHECK(!memcmp(words, back, sizeof words), "the same device memory");
	ibv_unimport_dm(idm);
	CHECK(!ibv_free_dm(dm), "ibv_free_dm");

	/* Unimported, the originals still serve. */
	CHECK(!ibv_destroy_qp(a) && !ibv_destroy_cq(cq), "the imported context's objects go");
	ibv_unimport_mr(imr);
	CHECK(!ibv_rereg_mr(smr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, access), "unimported, it can");
	ibv_unimport_pd(ipd);
	CHECK(!ibv_close_device(ictx), "the imported context closes");
	CHECK(!ibv_destroy_qp(b) && !ibv_destroy_cq(ocq), "the original QP and CQ");
	uint32_t pd_handle = pd->handle;
	CHECK(!ibv_dereg_mr(smr) && !ibv_dereg_mr(dmr) && !ibv_dealloc_pd(pd), "the originals deregistered");
	CHECK(!ibv_import_pd(ctx, pd_handle) && errno == ENOENT, "a deallocated PD cannot be imported");
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	puts("import ok");
	return 0;
}
