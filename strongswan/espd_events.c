/*
 * Copyright (C) 2025 The espd authors
 *
 * This program is free software; you can redistribute it and/or modify it
 * under the terms of the GNU General Public License as published by the
 * Free Software Foundation; either version 2 of the License, or (at your
 * option) any later version.  See COPYING.
 */

#include "espd_events.h"
#include "espd_plugin.h"
#include "espd_conn.h"
#include "espd_host.h"

#include <errno.h>
#include <netinet/in.h>
#include <unistd.h>

#include <daemon.h>
#include <threading/thread.h>

typedef struct private_espd_events_t private_espd_events_t;

/**
 * Private data.
 */
struct private_espd_events_t {

	/**
	 * Public interface
	 */
	espd_events_t public;

	/**
	 * Backend to reconcile
	 */
	espd_kernel_ipsec_t *ipsec;

	/**
	 * The thread
	 */
	thread_t *thread;

	/**
	 * Its connection, -1 if none
	 */
	int fd;

	/**
	 * Receive buffer
	 */
	uint8_t *buf;
};

/** all event kinds: soft, hard, acquire, mapping */
#define EVENT_MASK 0x1E

static const char *reason_name(uint32_t r)
{
	switch (r)
	{
		case 1:
			return "byte limit";
		case 2:
			return "packet limit";
		case 3:
			return "lifetime";
		case 4:
			return "lifetime since first use";
		case 5:
			return "sequence numbers exhausted";
		default:
			return "unknown reason";
	}
}

/**
 * A traffic selector for one endpoint of the packet behind an acquire.
 */
static traffic_selector_t *flow_ts(const espd_addr_t *a, uint8_t proto,
								   uint16_t port)
{
	chunk_t addr = chunk_create((u_char*)a->b, a->len);
	uint16_t from = port, to = port;

	if (a->len != 4 && a->len != 16)
	{
		return NULL;
	}
	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP &&
		proto != IPPROTO_SCTP && proto != IPPROTO_ICMP &&
		proto != IPPROTO_ICMPV6)
	{
		from = 0;
		to = 0xFFFF;
	}
	return traffic_selector_create_from_bytes(proto,
						a->len == 4 ? TS_IPV4_ADDR_RANGE : TS_IPV6_ADDR_RANGE,
						addr, from, addr, to);
}

/**
 * Turn one EVENT into charon's kernel event. Returns TRUE if events were
 * lost before it.
 */
static bool handle_event(private_espd_events_t *this, const uint8_t *body,
						 size_t len)
{
	espd_iter_t it, in;
	espd_attr_t a, b;
	espd_addr_t dst = {}, new_addr = {}, fl_src = {}, fl_dst = {};
	uint32_t type = 0, spi = 0, dir = 0, reqid = 0, reason = 0;
	uint32_t new_port = 0, fl_proto = 0;
	uint16_t fl_sport = 0, fl_dport = 0;
	uint64_t lost = 0;
	host_t *host, *remote;

	espd_iter_init(&it, body, len);
	while (espd_iter_next(&it, &a))
	{
		switch (a.type)
		{
			case ESPD_A_EVENT_TYPE:
				espd_attr_u32(&a, &type);
				break;
			case ESPD_A_SPI:
				espd_attr_u32(&a, &spi);
				break;
			case ESPD_A_DST:
				espd_attr_addr(&a, &dst);
				break;
			case ESPD_A_DIR:
				espd_attr_u32(&a, &dir);
				break;
			case ESPD_A_REQID:
				espd_attr_u32(&a, &reqid);
				break;
			case ESPD_A_EXPIRE_REASON:
				espd_attr_u32(&a, &reason);
				break;
			case ESPD_A_NEW_ADDR:
				espd_attr_addr(&a, &new_addr);
				break;
			case ESPD_A_NEW_PORT:
				espd_attr_u32(&a, &new_port);
				break;
			case ESPD_A_EVENTS_LOST:
				espd_attr_u64(&a, &lost);
				break;
			case ESPD_A_FLOW:
				espd_iter_nested(&in, &a);
				while (espd_iter_next(&in, &b))
				{
					switch (b.type)
					{
						case ESPD_FL_SRC:
							espd_attr_addr(&b, &fl_src);
							break;
						case ESPD_FL_DST:
							espd_attr_addr(&b, &fl_dst);
							break;
						case ESPD_FL_PROTO:
							espd_attr_u32(&b, &fl_proto);
							break;
						case ESPD_FL_PORTS:
							espd_attr_pair(&b, &fl_sport, &fl_dport);
							break;
					}
				}
				break;
		}
	}
	if (it.bad)
	{
		DBG1(DBG_KNL, "espd: ignoring a malformed event");
		return lost > 0;
	}
	if (lost)
	{
		DBG1(DBG_KNL, "espd: %llu events were lost (queue full); checking "
			 "the SAs", (unsigned long long)lost);
	}

	switch (type)
	{
		case ESPD_EV_SOFT:
		case ESPD_EV_HARD:
			host = espd_addr2host(&dst, 0);
			if (!host)
			{
				DBG1(DBG_KNL, "espd: expire event without a destination");
				break;
			}
			DBG1(DBG_KNL, "espd: %s SA %.8x (reqid %u) %s-expired: %s",
				 dir == ESPD_DIR_IN ? "inbound" : "outbound", spi, reqid,
				 type == ESPD_EV_HARD ? "hard" : "soft", reason_name(reason));
			if (type == ESPD_EV_HARD)
			{
				this->ipsec->forget_sa(this->ipsec, spi, host);
			}
			charon->kernel->expire(charon->kernel, IPPROTO_ESP, htonl(spi),
								   host, type == ESPD_EV_HARD);
			host->destroy(host);
			break;
		case ESPD_EV_ACQUIRE:
		{
			kernel_acquire_data_t data = {};
			uint16_t sport = fl_sport, dport = fl_dport;

			if (fl_proto == IPPROTO_ICMP || fl_proto == IPPROTO_ICMPV6)
			{
				/* charon keeps ICMP type and code in the port fields */
				sport = dport = fl_sport << 8 | (fl_dport & 0xFF);
			}
			if (fl_src.len && fl_dst.len)
			{
				data.src = flow_ts(&fl_src, fl_proto, sport);
				data.dst = flow_ts(&fl_dst, fl_proto, dport);
			}
			DBG2(DBG_KNL, "espd: acquire for reqid %u", reqid);
			charon->kernel->acquire(charon->kernel, reqid, &data);
			DESTROY_IF(data.src);
			DESTROY_IF(data.dst);
			break;
		}
		case ESPD_EV_MAPPING:
			host = espd_addr2host(&dst, 0);
			remote = espd_addr2host(&new_addr, new_port);
			if (host && remote)
			{
				charon->kernel->mapping(charon->kernel, IPPROTO_ESP,
										htonl(spi), host, remote);
			}
			DESTROY_IF(host);
			DESTROY_IF(remote);
			break;
		default:
			break;
	}
	return lost > 0;
}

/**
 * Sleep in a cancellable way.
 */
static void nap(int ms)
{
	bool old = thread_cancelability(TRUE);

	usleep(ms * 1000);
	thread_cancelability(old);
}

static void close_fd(private_espd_events_t *this)
{
	if (this->fd >= 0)
	{
		close(this->fd);
		this->fd = -1;
	}
}

/**
 * SUBSCRIBE on a fresh connection. Returns 0 or -errno.
 */
static int subscribe(private_espd_events_t *this, char *err, size_t errlen)
{
	espd_msg_t m;
	espd_hdr_t h;
	int r;

	if (!espd_msg_init(&m, ESPD_MSG_SUBSCRIBE, 1))
	{
		return -ENOMEM;
	}
	espd_msg_u32(&m, ESPD_A_EVENT_MASK, EVENT_MASK);
	espd_msg_finish(&m);
	r = espd_write_all(this->fd, m.buf, m.len, espd_settings.timeout_ms);
	espd_msg_free(&m);
	while (r == 0)
	{
		r = espd_read_msg(this->fd, this->buf, &h, espd_settings.timeout_ms,
						  espd_settings.timeout_ms);
		if (r < 0)
		{
			break;
		}
		if (!(h.flags & ESPD_F_REPLY) || h.seq != 1)
		{
			continue;
		}
		if (h.type == ESPD_MSG_ERROR)
		{
			espd_parse_error(this->buf + ESPD_HDR_LEN, h.length - ESPD_HDR_LEN,
							 err, errlen);
			return -EPROTO;
		}
		return 0;
	}
	snprintf(err, errlen, "%s", strerror(-r));
	return r;
}

static void *run(private_espd_events_t *this)
{
	char err[512], server[128];
	espd_hdr_t h;
	bool was_connected = FALSE, old, lost;
	time_t last_log = 0;
	int backoff = 100, r;

	/* cancellation only where the thread waits (reads, naps), never while
	 * it holds a lock or talks to espd */
	thread_cancelability(FALSE);
	thread_cleanup_push((thread_cleanup_t)close_fd, this);
	for (;;)
	{
		err[0] = 0;
		this->fd = espd_dial(espd_settings.socket, espd_settings.timeout_ms,
							 err, sizeof(err), server, sizeof(server));
		if (this->fd >= 0 && subscribe(this, err, sizeof(err)) != 0)
		{
			close_fd(this);
		}
		if (this->fd < 0)
		{
			if (!last_log || time_monotonic(NULL) - last_log >= 60)
			{
				last_log = time_monotonic(NULL);
				DBG1(DBG_KNL, "espd: not connected to espd (%s); charon "
					 "keeps running, but no CHILD_SA can be installed until "
					 "espd is back", err);
			}
			nap(backoff);
			backoff = min(backoff * 2, 250);
			continue;
		}
		backoff = 100;
		last_log = 0;
		DBG1(DBG_KNL, "espd: %s espd at %s (%s), receiving its events",
			 was_connected ? "reconnected to" : "connected to",
			 espd_settings.socket, server);
		/* the SAs charon installed may have died with a previous espd */
		this->ipsec->reconcile(this->ipsec);
		was_connected = TRUE;

		for (;;)
		{
			old = thread_cancelability(TRUE);
			r = espd_read_msg(this->fd, this->buf, &h, -1,
							  espd_settings.timeout_ms);
			thread_cancelability(old);
			if (r < 0)
			{
				DBG1(DBG_KNL, "espd: lost the connection to espd (%s); if "
					 "espd stopped, its SAs died with it and charon will "
					 "replace them once espd is back",
					 r == -ECONNRESET ? "closed" : strerror(-r));
				break;
			}
			if (h.type == ESPD_MSG_EVENT)
			{
				lost = handle_event(this, this->buf + ESPD_HDR_LEN,
									h.length - ESPD_HDR_LEN);
				if (lost)
				{
					this->ipsec->reconcile(this->ipsec);
				}
			}
			else if (h.type == ESPD_MSG_ERROR && h.seq == 0)
			{
				espd_parse_error(this->buf + ESPD_HDR_LEN,
								 h.length - ESPD_HDR_LEN, err, sizeof(err));
				DBG1(DBG_KNL, "espd: espd closes the event connection: %s",
					 err);
			}
		}
		close_fd(this);
		nap(100);
	}
	thread_cleanup_pop(TRUE);
	return NULL;
}

METHOD(espd_events_t, destroy, void,
	private_espd_events_t *this)
{
	if (this->thread)
	{
		this->thread->cancel(this->thread);
		this->thread->join(this->thread);
	}
	free(this->buf);
	free(this);
}

/*
 * Described in header.
 */
espd_events_t *espd_events_create(espd_kernel_ipsec_t *ipsec)
{
	private_espd_events_t *this;

	INIT(this,
		.public = {
			.destroy = _destroy,
		},
		.ipsec = ipsec,
		.fd = -1,
		.buf = malloc(ESPD_MAX_MSG),
	);
	this->thread = thread_create((thread_main_t)run, this);
	if (!this->thread)
	{
		DBG1(DBG_KNL, "espd: cannot start the event thread");
	}
	return &this->public;
}
