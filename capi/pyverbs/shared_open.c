/*
 * Diagnostic only (`run --share-device`): makes every ibv_open_device() of a
 * device that this process already has open return that same ibv_context,
 * counted, and ibv_close_device() close it when the last user does.
 *
 * Why: rdma-core's traffic tests open the device twice in one process (a
 * server and a client resource, each with its own Context) and connect the
 * two over the device's own GID (loopback).  softrdma binds the device's
 * address once per ibv_context, so the second context's first object fails
 * with EADDRINUSE.  This shim shows what those tests do once one device's
 * contexts share one engine in a process.  It is not a fix: a real fix is in
 * the library (and gives each context its own objects and async events).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

struct ibv_device;
struct ibv_context;

#define MAXOPEN 64
static struct { struct ibv_device *dev; struct ibv_context *ctx; int refs; } opened[MAXOPEN];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static struct ibv_context *(*real_open)(struct ibv_device *);
static int (*real_close)(struct ibv_context *);

/* Python loads pyverbs' modules RTLD_LOCAL, so libibverbs is not in the
 * global scope RTLD_NEXT searches: ask the loaded library itself. */
static void resolve(void)
{
	void *lib;

	if (real_open && real_close)
		return;
	lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_NOLOAD);
	if (!lib)
		lib = dlopen("libibverbs.so.1", RTLD_NOW);
	if (lib) {
		real_open = dlvsym(lib, "ibv_open_device", "IBVERBS_1.1");
		real_close = dlvsym(lib, "ibv_close_device", "IBVERBS_1.1");
	}
	if (!real_open || !real_close) {
		fprintf(stderr, "shared_open: cannot find libibverbs.so.1's ibv_open_device/ibv_close_device\n");
		abort();
	}
}

struct ibv_context *ibv_open_device(struct ibv_device *dev)
{
	struct ibv_context *ctx;
	int i, free_slot = -1;

	pthread_mutex_lock(&lock);
	resolve();
	for (i = 0; i < MAXOPEN; i++) {
		if (opened[i].refs && opened[i].dev == dev) {
			opened[i].refs++;
			ctx = opened[i].ctx;
			pthread_mutex_unlock(&lock);
			return ctx;
		}
		if (!opened[i].refs && free_slot < 0)
			free_slot = i;
	}
	ctx = real_open(dev);
	if (ctx && free_slot >= 0) {
		opened[free_slot].dev = dev;
		opened[free_slot].ctx = ctx;
		opened[free_slot].refs = 1;
	}
	pthread_mutex_unlock(&lock);
	return ctx;
}

int ibv_close_device(struct ibv_context *ctx)
{
	int i, ret = 0;

	pthread_mutex_lock(&lock);
	resolve();
	for (i = 0; i < MAXOPEN; i++) {
		if (opened[i].refs && opened[i].ctx == ctx) {
			if (--opened[i].refs == 0)
				ret = real_close(ctx);
			pthread_mutex_unlock(&lock);
			return ret;
		}
	}
	ret = real_close(ctx);
	pthread_mutex_unlock(&lock);
	return ret;
}
