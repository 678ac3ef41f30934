/*
 * Copyright (C) 2025 The espd authors
 *
 * This program is free software; you can redistribute it and/or modify it
 * under the terms of the GNU General Public License as published by the
 * Free Software Foundation; either version 2 of the License, or (at your
 * option) any later version.  See COPYING.
 */

/*
 * Why one file of about 2,200 lines: this is one strongSwan object, the
 * kernel_ipsec_t backend (SAs, policies, the reconcile of charon's CHILD_SAs
 * against espd's state), written in strongSwan's METHOD style, where every
 * method takes the object's private struct. Splitting it would publish that
 * struct in a header for every part to share; strongSwan's own kernel
 * backends (kernel_netlink_ipsec.c, kernel_pfkey_ipsec.c) are one file each
 * too. The sections below follow the interface: SAs, policies, sockets,
 * reconcile.
 */

#include "espd_kernel_ipsec.h"
#include "espd_plugin.h"
#include "espd_conn.h"
#include "espd_events.h"
#include "espd_host.h"

#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>

#include <daemon.h>
#include <collections/hashtable.h>
#include <collections/linked_list.h>
#include <processing/jobs/callback_job.h>
#include <threading/mutex.h>

/*
 * strongSwan 5.9 (Debian 12) and 6.0 (Debian 13). build.sh defines
 * ESPD_SS_VERSION as MAJOR * 10000 + MINOR * 100 + PATCH from the VERSION in
 * the config.h of the source it compiles against (5.9.8: 50908, 6.0.1:
 * 60001). What 6.0 changed in the interfaces this file implements, and what
 * the plugin does about each:
 *
 * - hw_offload_t: 5.9's HW_OFFLOAD_YES is 6.0's HW_OFFLOAD_CRYPTO (same value,
 *   new name), and 6.0 adds HW_OFFLOAD_PACKET (hw_offload = packet), with
 *   HW_OFFLOAD_AUTO moved from 2 to 3. add_sa refuses crypto and packet
 *   offload by name; no and auto install the SA (espd does the crypto).
 * - kernel_ipsec_manage_policy_t gains hw_offload (the CHILD_SA's setting, for
 *   packet offload of policies). add_policy refuses crypto and packet by name,
 *   as add_sa does; del_policy ignores it (a delete is never refused).
 * - kernel_feature_t gains KERNEL_SA_USE_TIME: a backend that reports an SA's
 *   last use from query_sa says so, and 6.0's charon then never asks
 *   query_policy for use times; without it, it asks only query_policy, which
 *   espd cannot answer, and sees no use at all (inactivity = closes busy
 *   CHILD_SAs). espd's query_sa reports the last use, so on 6.0
 *   get_features adds KERNEL_SA_USE_TIME. 5.9 falls back to query_sa by itself.
 * - query_sa and query_policy: the same signatures; the times are documented
 *   as time_monotonic() values, which is what this plugin returns.
 * - kernel_ipsec_sa_id_t, kernel_ipsec_add_sa_t, kernel_ipsec_update_sa_t,
 *   kernel_ipsec_del_sa_t, kernel_ipsec_policy_id_t, kernel_acquire_data_t and
 *   the kernel_ipsec_t methods: no other change (no per-CPU SAs in 6.0.1).
 * - controller_t: initiate (and terminate_ike/terminate_child, unused here)
 *   take a max_level for the logging callback before the timeout. The orphan
 *   check initiates without a callback, so on 6.0 it passes LEVEL_SILENT.
 * - kernel_interface_t: release_reqid lost its mark/if_id/label arguments and
 *   ref_reqid is new; listener_t's ike_keys and child_keys take an array of
 *   key exchanges. The plugin calls none of them (it calls acquire, expire and
 *   mapping, which are unchanged).
 */
#ifndef ESPD_SS_VERSION
#error "ESPD_SS_VERSION is not defined: build the plugin with strongswan/build.sh"
#endif

typedef struct private_espd_kernel_ipsec_t private_espd_kernel_ipsec_t;

/**
 * Private data.
 */
struct private_espd_kernel_ipsec_t {

	/**
	 * Public interface
	 */
	espd_kernel_ipsec_t public;

	/**
	 * Request connection to espd
	 */
	espd_conn_t *conn;

	/**
	 * Event thread
	 */
	espd_events_t *events;

	/**
	 * Guards sas and policies; taken before the connection's lock
	 */
	mutex_t *mutex;

	/**
	 * Installed SAs, sa_entry_t by SPI and destination
	 */
	hashtable_t *sas;

	/**
	 * Policies charon asked for, policy_entry_t by direction, selectors
	 * and interface ID
	 */
	hashtable_t *policies;

	/**
	 * SPI allocation range
	 */
	uint32_t spi_min, spi_max;

	/**
	 * Address families (bit 0: IPv4, bit 1: IPv6) for which charon's
	 * socket-default opened its IKE port and its NAT-T port (guarded by
	 * mutex), and whether the check that compares them is scheduled
	 */
	u_int ike_families, natt_families;
	bool natt_check;

	/**
	 * Whether check_retained() is scheduled (guarded by mutex)
	 */
	bool retain_check;

	/**
	 * Whether espd was checked for a previous charon's SAs (reconcile)
	 */
	bool orphans_checked;

	/**
	 * peer_t: peers that a previous charon had SAs with, to negotiate
	 * with again (guarded by mutex)
	 */
	linked_list_t *orphan_peers;

	/**
	 * When check_orphans() gives up on them (monotonic)
	 */
	time_t orphans_until;
};

/**
 * The outer addresses of a previous charon's SAs: us and the peer.
 */
typedef struct {
	host_t *me, *other;
} peer_t;

static void peer_destroy(peer_t *p)
{
	p->me->destroy(p->me);
	p->other->destroy(p->other);
	free(p);
}

/**
 * One SELECTOR of an SA: traffic from src_ts to dst_ts.
 */
typedef struct {
	traffic_selector_t *src_ts, *dst_ts;
} sel_pair_t;

static void sel_pair_destroy(sel_pair_t *p)
{
	p->src_ts->destroy(p->src_ts);
	p->dst_ts->destroy(p->dst_ts);
	free(p);
}

/**
 * An SA installed into espd (no keys).
 */
typedef struct {
	/** SPI, host order */
	uint32_t spi;
	/** outer addresses */
	host_t *src, *dst;
	/** direction */
	bool inbound;
	/** reqid */
	uint32_t reqid;
	/** interface ID (0: none), which update_sa() sends again: espd names
	 * an SA by SPI and destination alone, but an SA_UPDATE may carry only
	 * the SA's own */
	uint32_t if_id;
	/** MODE_TUNNEL or MODE_TRANSPORT */
	ipsec_mode_t mode;
	/** sel_pair_t: the SELECTORs add_sa() sent, which update_sa() sends
	 * again where one names an endpoint that moves (NULL: none) */
	linked_list_t *sels;
	/** bytes at the last query, and when they last grew (monotonic) */
	uint64_t last_bytes;
	time_t last_use;
} sa_entry_t;

static void sa_entry_destroy(sa_entry_t *e)
{
	e->src->destroy(e->src);
	e->dst->destroy(e->dst);
	if (e->sels)
	{
		e->sels->destroy_function(e->sels, (void*)sel_pair_destroy);
	}
	free(e);
}

static u_int sa_hash(const sa_entry_t *e)
{
	return chunk_hash_inc(e->dst->get_address(e->dst), e->spi);
}

static bool sa_equals(const sa_entry_t *a, const sa_entry_t *b)
{
	return a->spi == b->spi && a->dst->ip_equals(a->dst, b->dst);
}

/** size of format_if_id()'s buffer */
#define IF_ID_STR_LEN 24

/**
 * " if_id N" for logs, "" without an interface ID.
 */
static char *format_if_id(char *buf, size_t len, uint32_t if_id)
{
	if (if_id)
	{
		snprintf(buf, len, " if_id %u", if_id);
	}
	else if (len)
	{
		buf[0] = '\0';
	}
	return buf;
}

/**
 * One request for a policy (charon installs the same policy once per
 * CHILD_SA that uses it, and trap, drop and IPsec variants of it).
 */
typedef struct {
	policy_type_t type;
	policy_priority_t prio;
	uint32_t manual_prio;
	/** priority sent to espd, lower wins */
	uint32_t priority;
	uint32_t reqid;
	/** template: outer addresses of the SAs, may be NULL */
	host_t *src, *dst;
	/** template: MODE_TRANSPORT for an IPsec policy of a transport-mode
	 * CHILD_SA, else MODE_TUNNEL */
	ipsec_mode_t mode;
} policy_user_t;

static void policy_user_destroy(policy_user_t *u)
{
	DESTROY_IF(u->src);
	DESTROY_IF(u->dst);
	free(u);
}

/**
 * A policy as espd knows it: direction, selector and interface ID, with
 * the requests for it. The best request (lowest priority, newest on a tie)
 * is installed.
 */
typedef struct {
	policy_dir_t dir;
	traffic_selector_t *src_ts, *dst_ts;
	/** interface ID (if_id_in, if_id_out; 0: none): espd holds the same
	 * selector and direction once per interface ID */
	uint32_t if_id;
	/** policy_user_t, oldest first */
	linked_list_t *users;
	/** installed in espd, with these values */
	bool installed;
	uint32_t inst_action, inst_priority, inst_reqid;
	ipsec_mode_t inst_mode;
	/** no request left, kept in espd as a drop policy while a loaded
	 * connection covers it (retain_policy) */
	bool retained;
} policy_entry_t;

static void policy_entry_destroy(policy_entry_t *e)
{
	e->users->destroy_function(e->users, (void*)policy_user_destroy);
	e->src_ts->destroy(e->src_ts);
	e->dst_ts->destroy(e->dst_ts);
	free(e);
}

static u_int policy_hash(const policy_entry_t *e)
{
	return e->src_ts->hash(e->src_ts, e->dst_ts->hash(e->dst_ts,
						   chunk_hash_inc(chunk_from_thing(e->if_id), e->dir)));
}

static bool policy_equals(const policy_entry_t *a, const policy_entry_t *b)
{
	return a->dir == b->dir && a->if_id == b->if_id &&
		   a->src_ts->equals(a->src_ts, b->src_ts) &&
		   a->dst_ts->equals(a->dst_ts, b->dst_ts);
}

static void put_host(espd_msg_t *m, uint16_t type, host_t *h)
{
	espd_addr_t a;

	if (espd_host2addr(h, &a))
	{
		espd_msg_addr(m, type, &a);
	}
	else
	{
		m->failed = TRUE;
	}
}

/**
 * Append a traffic selector's address range as a prefix; a range that is
 * no subnet becomes the smallest subnet that covers it.
 */
static int put_ts_addr(espd_msg_t *m, uint16_t type, traffic_selector_t *ts)
{
	host_t *net;
	uint8_t bits;
	espd_addr_t a;
	bool exact;

	exact = ts->to_subnet(ts, &net, &bits);
	if (!espd_host2addr(net, &a))
	{
		net->destroy(net);
		m->failed = TRUE;
		return 0;
	}
	net->destroy(net);
	if (!exact)
	{
		DBG1(DBG_KNL, "espd: traffic selector %R is no subnet; espd gets "
			 "the covering subnet /%u", ts, bits);
	}
	espd_msg_prefix(m, type, &a, bits);
	return bits;
}

/**
 * Append the ports of a traffic selector; ICMP type and code travel in the
 * port fields (type in the high byte).
 */
static int put_ports(espd_msg_t *m, uint16_t src_type, uint16_t dst_type,
					 traffic_selector_t *ts, bool src)
{
	uint16_t from = ts->get_from_port(ts), to = ts->get_to_port(ts);
	uint8_t proto = ts->get_protocol(ts);

	if (from == 0 && to == 0xFFFF)
	{
		return 0;
	}
	if (proto == IPPROTO_ICMP || proto == IPPROTO_ICMPV6)
	{
		/* espd: SEL_SRC_PORTS holds the type, SEL_DST_PORTS the code; only
		 * the ICMP selector of one side carries them */
		if (!src)
		{
			return 0;
		}
		espd_msg_pair(m, src_type, from >> 8, to >> 8);
		if ((from & 0xFF) != 0 || (to & 0xFF) != 0xFF)
		{
			espd_msg_pair(m, dst_type, from & 0xFF, to & 0xFF);
		}
		return from == to ? 16 : 0;
	}
	espd_msg_pair(m, src ? src_type : dst_type, from, to);
	return from == to ? 16 : 0;
}

/**
 * Append a SELECTOR for traffic from src_ts to dst_ts. Returns the
 * specificity used for priorities: prefix bits*512, protocol 256, ports 4
 * per bit, as charon's kernel-netlink computes them.
 */
static uint32_t put_selector(espd_msg_t *m, traffic_selector_t *src_ts,
							 traffic_selector_t *dst_ts)
{
	uint32_t spec = 0;
	uint8_t proto;

	espd_msg_begin(m, ESPD_A_SELECTOR);
	spec += put_ts_addr(m, ESPD_SEL_SRC, src_ts) * 512;
	spec += put_ts_addr(m, ESPD_SEL_DST, dst_ts) * 512;
	proto = src_ts->get_protocol(src_ts) ?: dst_ts->get_protocol(dst_ts);
	if (proto)
	{
		espd_msg_u32(m, ESPD_SEL_PROTO, proto);
		spec += 256;
		spec += put_ports(m, ESPD_SEL_SRC_PORTS, ESPD_SEL_DST_PORTS, src_ts,
						  TRUE) * 4;
		if (proto != IPPROTO_ICMP && proto != IPPROTO_ICMPV6)
		{
			spec += put_ports(m, ESPD_SEL_SRC_PORTS, ESPD_SEL_DST_PORTS,
							  dst_ts, FALSE) * 4;
		}
	}
	espd_msg_end(m);
	return spec;
}

/**
 * Send a request on the request connection; logs failures but the espd
 * error quiet (0: none), which the caller expects and handles. Returns 0,
 * a positive espd error code or a negative transport error.
 */
static int request(private_espd_kernel_ipsec_t *this, espd_msg_t *m,
				   espd_reply_cb_t cb, void *ctx, const char *what,
				   int quiet)
{
	char err[512] = "";
	int r;

	if (m->failed)
	{
		DBG1(DBG_KNL, "espd: %s: request could not be encoded", what);
		espd_msg_free(m);
		return -EINVAL;
	}
	r = espd_conn_request(this->conn, m, cb, ctx, err, sizeof(err));
	espd_msg_free(m);
	if (r > 0 && r != quiet)
	{
		DBG1(DBG_KNL, "espd: %s failed: %s (%s)", what, err,
			 espd_errno_name(r));
	}
	else if (r < 0)
	{
		DBG1(DBG_KNL, "espd: %s failed: %s", what, err);
	}
	return r;
}

METHOD(kernel_ipsec_t, get_features, kernel_feature_t,
	private_espd_kernel_ipsec_t *this)
{
#if ESPD_SS_VERSION >= 60000
	/* query_sa reports the last use (see the comment at the top) */
	return KERNEL_ESP_V3_TFC | KERNEL_SA_USE_TIME;
#else
	return KERNEL_ESP_V3_TFC;
#endif
}

/* reply to SPI_ALLOC */
static void spi_reply(void *ctx, const espd_hdr_t *h, const uint8_t *body,
					  size_t len)
{
	uint32_t *spi = ctx;
	espd_iter_t it;
	espd_attr_t a;

	espd_iter_init(&it, body, len);
	while (espd_iter_next(&it, &a))
	{
		if (a.type == ESPD_A_SPI)
		{
			espd_attr_u32(&a, spi);
		}
	}
}

METHOD(kernel_ipsec_t, get_spi, status_t,
	private_espd_kernel_ipsec_t *this, host_t *src, host_t *dst,
	uint8_t protocol, uint32_t *spi)
{
	espd_msg_t m;
	uint32_t got = 0;

	if (protocol != IPPROTO_ESP)
	{
		DBG1(DBG_KNL, "espd: refused: %s; espd carries ESP only (use "
			 "esp_proposals, not ah_proposals)", protocol == IPPROTO_AH ?
			 "AH" : "an IPsec protocol other than ESP");
		return NOT_SUPPORTED;
	}
	if (!espd_msg_init(&m, ESPD_MSG_SPI_ALLOC, 0))
	{
		return FAILED;
	}
	espd_msg_u32(&m, ESPD_A_SPI_MIN, this->spi_min);
	espd_msg_u32(&m, ESPD_A_SPI_MAX, this->spi_max);
	if (request(this, &m, spi_reply, &got, "allocating an SPI", 0) != 0 ||
		got == 0)
	{
		return FAILED;
	}
	*spi = htonl(got);
	DBG2(DBG_KNL, "espd: allocated SPI %.8x", got);
	return SUCCESS;
}

METHOD(kernel_ipsec_t, get_cpi, status_t,
	private_espd_kernel_ipsec_t *this, host_t *src, host_t *dst,
	uint16_t *cpi)
{
	DBG1(DBG_KNL, "espd: refused: IPComp (ipcomp = yes) is not supported "
		 "by espd");
	return NOT_SUPPORTED;
}

/**
 * Encryption key bits without salt, as espd's ENC_KEYLEN wants them.
 */
static uint32_t enc_key_bits(uint16_t alg, size_t len)
{
	switch (alg)
	{
		case ENCR_NULL:
			return 0;
		case ENCR_AES_GCM_ICV8:
		case ENCR_AES_GCM_ICV12:
		case ENCR_AES_GCM_ICV16:
		case ENCR_NULL_AUTH_AES_GMAC:
		case ENCR_CHACHA20_POLY1305:
			return len >= 4 ? (len - 4) * 8 : 0;
		case ENCR_AES_CCM_ICV8:
		case ENCR_AES_CCM_ICV12:
		case ENCR_AES_CCM_ICV16:
			return len >= 3 ? (len - 3) * 8 : 0;
		default:
			return len * 8;
	}
}

/* seconds to nanoseconds, saturating below 2^63 */
static uint64_t s2ns(uint64_t s)
{
	const uint64_t max = (UINT64_C(1) << 63) - 1;

	return s > max / 1000000000 ? max : s * 1000000000;
}

static void put_lifetime(espd_msg_t *m, uint16_t type, uint64_t bytes,
						 uint64_t packets, uint64_t time)
{
	if (!bytes && !packets && !time)
	{
		return;
	}
	espd_msg_begin(m, type);
	if (bytes)
	{
		espd_msg_u64(m, ESPD_LT_BYTES, bytes);
	}
	if (packets)
	{
		espd_msg_u64(m, ESPD_LT_PACKETS, packets);
	}
	if (time)
	{
		espd_msg_u64(m, ESPD_LT_ADD_TIME, s2ns(time));
	}
	espd_msg_end(m);
}

/**
 * Whether an SA or policy asks for hardware offload that espd cannot give:
 * crypto offload (5.9's yes, 6.0's yes or crypto) and 6.0's packet offload.
 */
static bool hw_offload_refused(hw_offload_t mode)
{
#if ESPD_SS_VERSION >= 60000
	return mode == HW_OFFLOAD_CRYPTO || mode == HW_OFFLOAD_PACKET;
#else
	return mode == HW_OFFLOAD_YES;
#endif
}

/**
 * The swanctl.conf value of a refused hw_offload mode.
 */
static const char *hw_offload_name(hw_offload_t mode)
{
#if ESPD_SS_VERSION >= 60000
	return mode == HW_OFFLOAD_PACKET ? "packet" : "crypto (or yes)";
#else
	return "yes";
#endif
}

METHOD(kernel_ipsec_t, add_sa, status_t,
	private_espd_kernel_ipsec_t *this, kernel_ipsec_sa_id_t *id,
	kernel_ipsec_add_sa_t *data)
{
	traffic_selector_t *src_ts, *dst_ts;
	enumerator_t *es, *ed;
	lifetime_cfg_t *lt = data->lifetime;
	sa_entry_t *entry, *old;
	linked_list_t *sels;
	sel_pair_t *pair;
	uint32_t spi = ntohl(id->spi);
	espd_msg_t m;
	char what[128], ifid[IF_ID_STR_LEN];

	if (id->proto != IPPROTO_ESP)
	{
		DBG1(DBG_KNL, "espd: SA %.8x: refused: %s; espd carries ESP only",
			 spi, id->proto == IPPROTO_AH ? "AH (ah_proposals)" :
			 "an IPsec protocol other than ESP");
		return NOT_SUPPORTED;
	}
	if (data->mode != MODE_TUNNEL && data->mode != MODE_TRANSPORT)
	{
		DBG1(DBG_KNL, "espd: SA %.8x: refused: mode %N; espd carries ESP in "
			 "tunnel or transport mode only", spi, ipsec_mode_names,
			 data->mode);
		return NOT_SUPPORTED;
	}
	if (data->ipcomp != IPCOMP_NONE)
	{
		DBG1(DBG_KNL, "espd: SA %.8x: refused: IPComp (ipcomp = yes) is not "
			 "supported by espd", spi);
		return NOT_SUPPORTED;
	}
	if (data->encap && !espd_settings.ike_handoff)
	{
		DBG1(DBG_KNL, "espd: SA %.8x needs UDP encapsulation (NAT), which "
			 "espd carries only with the IKE hand-off: run espd with "
			 "--ike-handoff and set charon.plugins.espd.ike_handoff = yes",
			 spi);
		return FAILED;
	}
	if (id->mark.value || id->mark.mask || data->mark.value ||
		data->mark.mask)
	{
		DBG1(DBG_KNL, "espd: SA %.8x: refused: marks (mark_in, mark_out, "
			 "set_mark_in, set_mark_out) are not supported by espd, which "
			 "would apply the SA to traffic the marks exclude; see "
			 "docs/strongswan.md, \"What espd supports\"", spi);
		return NOT_SUPPORTED;
	}
	if (data->copy_dscp == DSCP_COPY_IN_ONLY || data->copy_dscp == DSCP_COPY_YES)
	{
		DBG1(DBG_KNL, "espd: SA %.8x: refused: copy_dscp = %N; espd copies "
			 "the DSCP into the outer header only, never back into a "
			 "decrypted packet (use out, the default, or no)", spi,
			 dscp_copy_names, data->copy_dscp);
		return NOT_SUPPORTED;
	}
	if (hw_offload_refused(data->hw_offload))
	{
		DBG1(DBG_KNL, "espd: SA %.8x: refused: hw_offload = %s; espd does "
			 "the crypto itself (use hw_offload = no or auto)", spi,
			 hw_offload_name(data->hw_offload));
		return NOT_SUPPORTED;
	}
	if (data->label)
	{
		DBG1(DBG_KNL, "espd: SA %.8x: security labels are not supported", spi);
		return NOT_SUPPORTED;
	}

	if (!espd_msg_init(&m, ESPD_MSG_SA_ADD, 0))
	{
		return FAILED;
	}
	espd_msg_u32(&m, ESPD_A_SPI, spi);
	put_host(&m, ESPD_A_SRC, id->src);
	put_host(&m, ESPD_A_DST, id->dst);
	espd_msg_u32(&m, ESPD_A_DIR, data->inbound ? ESPD_DIR_IN : ESPD_DIR_OUT);
	espd_msg_u32(&m, ESPD_A_PROTO, IPPROTO_ESP);
	/* transport mode (RFC 4303 3.1.1): espd protects what follows the IP
	 * header of this host's own packets to and from the peer */
	espd_msg_u32(&m, ESPD_A_MODE, data->mode == MODE_TRANSPORT ?
				 ESPD_MODE_TRANSPORT : ESPD_MODE_TUNNEL);
	espd_msg_u32(&m, ESPD_A_REQID, data->reqid);
	if (id->if_id)
	{
		/* route-based (if_id_in, if_id_out): the SA belongs to that
		 * interface, as with an XFRM interface */
		espd_msg_u32(&m, ESPD_A_IF_ID, id->if_id);
	}
	espd_msg_u32(&m, ESPD_A_ENC_ALG, data->enc_alg);
	espd_msg_u32(&m, ESPD_A_ENC_KEYLEN,
				 enc_key_bits(data->enc_alg, data->enc_key.len));
	if (data->enc_key.len)
	{
		espd_msg_put(&m, ESPD_A_ENC_KEY, data->enc_key.ptr, data->enc_key.len);
	}
	if (data->int_alg != AUTH_UNDEFINED)
	{
		espd_msg_u32(&m, ESPD_A_INTEG_ALG, data->int_alg);
		espd_msg_put(&m, ESPD_A_INTEG_KEY, data->int_key.ptr,
					 data->int_key.len);
	}
	espd_msg_u32(&m, ESPD_A_ESN, data->esn ? 1 : 0);
	if (data->inbound)
	{
		espd_msg_u32(&m, ESPD_A_REPLAY_WINDOW, data->replay_window);
	}
	else if (data->tfc && data->mode == MODE_TUNNEL)
	{
		espd_msg_u32(&m, ESPD_A_TFC_PAD, min(data->tfc, 65535));
	}
	else if (data->tfc)
	{
		/* as kernel-netlink: a transport-mode packet carries no inner length
		 * that would tell the peer where the padding starts, and espd
		 * refuses it */
		DBG1(DBG_KNL, "espd: SA %.8x: tfc_padding applies to tunnel mode "
			 "only; the transport-mode SA is installed without it (as "
			 "the kernel's XFRM does)", spi);
	}
	if (data->encap)
	{
		espd_msg_pair(&m, ESPD_A_ENCAP, id->src->get_port(id->src),
					  id->dst->get_port(id->dst));
	}
	espd_msg_u32(&m, ESPD_A_ECN, data->copy_ecn ? 1 : 0);
	espd_msg_u32(&m, ESPD_A_DF, data->copy_df ? ESPD_DF_COPY : ESPD_DF_CLEAR);
	espd_msg_u32(&m, ESPD_A_COPY_DSCP,
				 data->copy_dscp == DSCP_COPY_OUT_ONLY ? 1 : 0);
	/* charon negotiated these keys for this CHILD_SA and never installs
	 * them again once it is gone: espd may forget their sequence numbers
	 * after its retention (a manual key's are kept for ever) */
	espd_msg_u32(&m, ESPD_A_NEGOTIATED, 1);
	if (lt)
	{
		if ((lt->bytes.life && lt->bytes.rekey > lt->bytes.life) ||
			(lt->packets.life && lt->packets.rekey > lt->packets.life) ||
			(lt->time.life && lt->time.rekey > lt->time.life))
		{
			DBG1(DBG_KNL, "espd: SA %.8x: a soft limit lies beyond its hard "
				 "limit (is rand_bytes/rand_packets above rekey_bytes/"
				 "rekey_packets?); the SA will not be rekeyed before it "
				 "expires", spi);
		}
		put_lifetime(&m, ESPD_A_LIFETIME_SOFT, lt->bytes.rekey,
					 lt->packets.rekey, lt->time.rekey);
		put_lifetime(&m, ESPD_A_LIFETIME_HARD, lt->bytes.life,
					 lt->packets.life, lt->time.life);
	}
	/* the inner traffic the SA may carry, in its direction (in transport
	 * mode the two hosts' own addresses: charon has already put the NAT's
	 * public address in place of a peer's private one, see update_sa) */
	sels = linked_list_create();
	if (data->src_ts && data->dst_ts)
	{
		es = data->src_ts->create_enumerator(data->src_ts);
		while (es->enumerate(es, &src_ts))
		{
			ed = data->dst_ts->create_enumerator(data->dst_ts);
			while (ed->enumerate(ed, &dst_ts))
			{
				if (src_ts->get_type(src_ts) == dst_ts->get_type(dst_ts))
				{
					put_selector(&m, src_ts, dst_ts);
					INIT(pair,
						.src_ts = src_ts->clone(src_ts),
						.dst_ts = dst_ts->clone(dst_ts),
					);
					sels->insert_last(sels, pair);
				}
			}
			ed->destroy(ed);
		}
		es->destroy(es);
	}

	snprintf(what, sizeof(what), "adding %s SA %.8x (reqid %u)",
			 data->inbound ? "inbound" : "outbound", spi, data->reqid);
	if (request(this, &m, NULL, NULL, what, 0) != 0)
	{
		sels->destroy_function(sels, (void*)sel_pair_destroy);
		return FAILED;
	}
	DBG2(DBG_KNL, "espd: added %s SA %.8x %H -> %H reqid %u%s%s",
		 data->inbound ? "inbound" : "outbound", spi, id->src, id->dst,
		 data->reqid, format_if_id(ifid, sizeof(ifid), id->if_id),
		 data->mode == MODE_TRANSPORT ? " transport mode" : "");

	INIT(entry,
		.spi = spi,
		.src = id->src->clone(id->src),
		.dst = id->dst->clone(id->dst),
		.inbound = data->inbound,
		.reqid = data->reqid,
		.if_id = id->if_id,
		.mode = data->mode,
		.sels = sels,
	);
	this->mutex->lock(this->mutex);
	old = this->sas->put(this->sas, entry, entry);
	this->mutex->unlock(this->mutex);
	if (old)
	{
		sa_entry_destroy(old);
	}
	return SUCCESS;
}

/**
 * Copy an SA's selectors for its endpoints' move from src, dst to new_src,
 * new_dst: a host selector of a moving endpoint moves with it, as
 * kernel-netlink's update_sa moves an XFRM state's selector. That is how a
 * transport-mode SA's selectors (the two hosts' own addresses) follow
 * MOBIKE or a NAT's new public address, as charon's policies do. Returns
 * NULL if no selector names a moving endpoint.
 */
static linked_list_t *moved_sels(linked_list_t *sels, host_t *src,
								 host_t *dst, host_t *new_src, host_t *new_dst)
{
	enumerator_t *enumerator;
	linked_list_t *out;
	sel_pair_t *p, *q;
	bool moved = FALSE, src_moves, dst_moves;

	src_moves = !src->ip_equals(src, new_src);
	dst_moves = !dst->ip_equals(dst, new_dst);
	if (!sels || (!src_moves && !dst_moves))
	{
		return NULL;
	}
	out = linked_list_create();
	enumerator = sels->create_enumerator(sels);
	while (enumerator->enumerate(enumerator, &p))
	{
		INIT(q,
			.src_ts = p->src_ts->clone(p->src_ts),
			.dst_ts = p->dst_ts->clone(p->dst_ts),
		);
		if (src_moves && q->src_ts->is_host(q->src_ts, src))
		{
			q->src_ts->set_address(q->src_ts, new_src);
			moved = TRUE;
		}
		if (dst_moves && q->dst_ts->is_host(q->dst_ts, dst))
		{
			q->dst_ts->set_address(q->dst_ts, new_dst);
			moved = TRUE;
		}
		out->insert_last(out, q);
	}
	enumerator->destroy(enumerator);
	if (!moved)
	{
		out->destroy_function(out, (void*)sel_pair_destroy);
		return NULL;
	}
	return out;
}

METHOD(kernel_ipsec_t, update_sa, status_t,
	private_espd_kernel_ipsec_t *this, kernel_ipsec_sa_id_t *id,
	kernel_ipsec_update_sa_t *data)
{
	sa_entry_t key = { .spi = ntohl(id->spi), .dst = id->dst }, *e;
	uint32_t if_id = id->if_id;
	linked_list_t *sels = NULL;
	enumerator_t *enumerator;
	sel_pair_t *p;
	espd_msg_t m;
	char what[128];
	int r;

	if (data->new_reqid)
	{
		DBG1(DBG_KNL, "espd: SA %.8x: the reqid cannot change (to %u)",
			 key.spi, data->new_reqid);
		return NOT_SUPPORTED;
	}
	if (data->new_encap && !espd_settings.ike_handoff)
	{
		DBG1(DBG_KNL, "espd: SA %.8x would need UDP encapsulation, which "
			 "needs the IKE hand-off (espd --ike-handoff)", key.spi);
		return FAILED;
	}
	/* the interface ID add_sa() sent (espd refuses another), and its
	 * selectors if the move changes them */
	this->mutex->lock(this->mutex);
	e = this->sas->get(this->sas, &key);
	if (e)
	{
		if_id = e->if_id;
		sels = moved_sels(e->sels, id->src, id->dst, data->new_src,
						  data->new_dst);
	}
	this->mutex->unlock(this->mutex);
	if (!espd_msg_init(&m, ESPD_MSG_SA_UPDATE, 0))
	{
		return FAILED;
	}
	espd_msg_u32(&m, ESPD_A_SPI, key.spi);
	put_host(&m, ESPD_A_DST, id->dst);
	if (if_id)
	{
		espd_msg_u32(&m, ESPD_A_IF_ID, if_id);
	}
	if (!data->new_src->ip_equals(data->new_src, id->src))
	{
		put_host(&m, ESPD_A_NEW_SRC, data->new_src);
	}
	if (!data->new_dst->ip_equals(data->new_dst, id->dst))
	{
		put_host(&m, ESPD_A_NEW_DST, data->new_dst);
	}
	if (data->new_encap)
	{
		espd_msg_pair(&m, ESPD_A_ENCAP, data->new_src->get_port(data->new_src),
					  data->new_dst->get_port(data->new_dst));
	}
	else
	{
		espd_msg_pair(&m, ESPD_A_ENCAP, 0, 0);
	}
	if (sels)
	{
		/* SELECTORs replace the state's whole list */
		enumerator = sels->create_enumerator(sels);
		while (enumerator->enumerate(enumerator, &p))
		{
			put_selector(&m, p->src_ts, p->dst_ts);
		}
		enumerator->destroy(enumerator);
	}
	snprintf(what, sizeof(what), "updating SA %.8x", key.spi);
	r = request(this, &m, NULL, NULL, what, 0);
	if (r != 0)
	{
		if (sels)
		{
			sels->destroy_function(sels, (void*)sel_pair_destroy);
		}
		return r == ENOENT ? NOT_FOUND : FAILED;
	}
	DBG2(DBG_KNL, "espd: updated SA %.8x to %#H -> %#H%s", key.spi,
		 data->new_src, data->new_dst, sels ? ", its selectors with it" : "");
	this->mutex->lock(this->mutex);
	e = this->sas->remove(this->sas, &key);
	if (e)
	{
		e->src->destroy(e->src);
		e->dst->destroy(e->dst);
		e->src = data->new_src->clone(data->new_src);
		e->dst = data->new_dst->clone(data->new_dst);
		if (sels)
		{
			if (e->sels)
			{
				e->sels->destroy_function(e->sels, (void*)sel_pair_destroy);
			}
			e->sels = sels;
			sels = NULL;
		}
		e = this->sas->put(this->sas, e, e);
		if (e)
		{
			sa_entry_destroy(e);
		}
	}
	this->mutex->unlock(this->mutex);
	if (sels)
	{
		sels->destroy_function(sels, (void*)sel_pair_destroy);
	}
	return SUCCESS;
}

/**
 * What a SA_GET reply says.
 */
typedef struct {
	bool found;
	uint32_t state;
	uint64_t bytes, packets, use_time, last_use;
} sa_stats_t;

static void stats_reply(void *ctx, const espd_hdr_t *h, const uint8_t *body,
						size_t len)
{
	sa_stats_t *st = ctx;
	espd_iter_t it, in;
	espd_attr_t a, b;

	espd_iter_init(&it, body, len);
	while (espd_iter_next(&it, &a))
	{
		if (a.type != ESPD_A_SA_STATS)
		{
			continue;
		}
		st->found = TRUE;
		espd_iter_nested(&in, &a);
		while (espd_iter_next(&in, &b))
		{
			switch (b.type)
			{
				case ESPD_ST_STATE:
					espd_attr_u32(&b, &st->state);
					break;
				case ESPD_ST_BYTES:
					espd_attr_u64(&b, &st->bytes);
					break;
				case ESPD_ST_PACKETS:
					espd_attr_u64(&b, &st->packets);
					break;
				case ESPD_ST_USE_TIME:
					espd_attr_u64(&b, &st->use_time);
					break;
				case ESPD_ST_LAST_USE:
					espd_attr_u64(&b, &st->last_use);
					break;
			}
		}
	}
}

/**
 * SA_GET; returns 0, an espd error or a transport error. espd names an SA
 * by SPI and destination: unlike XFRM's, its interface ID is no part of
 * that (nor in SA_DEL).
 */
static int get_sa(private_espd_kernel_ipsec_t *this, uint32_t spi,
				  host_t *dst, sa_stats_t *st, bool quiet)
{
	espd_msg_t m;
	char what[64];

	if (!espd_msg_init(&m, ESPD_MSG_SA_GET, 0))
	{
		return -ENOMEM;
	}
	espd_msg_u32(&m, ESPD_A_SPI, spi);
	put_host(&m, ESPD_A_DST, dst);
	snprintf(what, sizeof(what), "querying SA %.8x", spi);
	return request(this, &m, stats_reply, st, what, quiet ? ENOENT : 0);
}

METHOD(kernel_ipsec_t, query_sa, status_t,
	private_espd_kernel_ipsec_t *this, kernel_ipsec_sa_id_t *id,
	kernel_ipsec_query_sa_t *data, uint64_t *bytes, uint64_t *packets,
	time_t *time)
{
	sa_entry_t key = { .spi = ntohl(id->spi), .dst = id->dst }, *e;
	sa_stats_t st = {};
	time_t now, use = 0;
	int r;

	r = get_sa(this, key.spi, id->dst, &st, FALSE);
	if (r == ENOENT)
	{
		return NOT_FOUND;
	}
	if (r != 0 || !st.found)
	{
		return FAILED;
	}
	now = time_monotonic(NULL);
	if (st.last_use)
	{
		/* espd's last use, wall-clock ns: as a monotonic time for charon */
		struct timespec ts;
		int64_t ago;

		clock_gettime(CLOCK_REALTIME, &ts);
		ago = ((int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec -
			   (int64_t)st.last_use) / 1000000000;
		use = now - max(ago, (int64_t)0);
	}
	else
	{
		/* an espd without ST_LAST_USE: the time the byte count was last
		 * seen growing */
		this->mutex->lock(this->mutex);
		e = this->sas->get(this->sas, &key);
		if (e)
		{
			if (st.bytes > e->last_bytes)
			{
				e->last_bytes = st.bytes;
				e->last_use = now;
			}
			use = e->last_use;
		}
		this->mutex->unlock(this->mutex);
		if (!e && st.use_time)
		{
			use = now;
		}
	}
	if (bytes)
	{
		*bytes = st.bytes;
	}
	if (packets)
	{
		*packets = st.packets;
	}
	if (time)
	{
		*time = use;
	}
	return SUCCESS;
}

METHOD(kernel_ipsec_t, del_sa, status_t,
	private_espd_kernel_ipsec_t *this, kernel_ipsec_sa_id_t *id,
	kernel_ipsec_del_sa_t *data)
{
	sa_entry_t key = { .spi = ntohl(id->spi), .dst = id->dst }, *e;
	espd_msg_t m;
	char what[64];
	int r;

	this->mutex->lock(this->mutex);
	e = this->sas->remove(this->sas, &key);
	this->mutex->unlock(this->mutex);
	if (e)
	{
		sa_entry_destroy(e);
	}
	if (!espd_msg_init(&m, ESPD_MSG_SA_DEL, 0))
	{
		return FAILED;
	}
	espd_msg_u32(&m, ESPD_A_SPI, key.spi);
	put_host(&m, ESPD_A_DST, id->dst);
	snprintf(what, sizeof(what), "deleting SA %.8x", key.spi);
	r = request(this, &m, NULL, NULL, what, ENOENT);
	if (r == ENOENT)
	{
		/* expired in espd, or died with a previous espd */
		DBG2(DBG_KNL, "espd: SA %.8x was already gone", key.spi);
		return SUCCESS;
	}
	if (r != 0)
	{
		return FAILED;
	}
	DBG2(DBG_KNL, "espd: deleted SA %.8x", key.spi);
	return SUCCESS;
}

METHOD(kernel_ipsec_t, flush_sas, status_t,
	private_espd_kernel_ipsec_t *this)
{
	espd_msg_t m;
	enumerator_t *enumerator;
	sa_entry_t *e;

	this->mutex->lock(this->mutex);
	enumerator = this->sas->create_enumerator(this->sas);
	while (enumerator->enumerate(enumerator, NULL, &e))
	{
		this->sas->remove_at(this->sas, enumerator);
		sa_entry_destroy(e);
	}
	enumerator->destroy(enumerator);
	this->mutex->unlock(this->mutex);
	if (!espd_msg_init(&m, ESPD_MSG_SA_FLUSH, 0))
	{
		return FAILED;
	}
	return request(this, &m, NULL, NULL, "flushing SAs", 0) == 0 ?
			SUCCESS : FAILED;
}

static uint32_t dir2espd(policy_dir_t dir)
{
	switch (dir)
	{
		case POLICY_IN:
			return ESPD_DIR_IN;
		case POLICY_OUT:
			return ESPD_DIR_OUT;
		default:
			return ESPD_DIR_FWD;
	}
}

static uint32_t type2action(policy_type_t type)
{
	switch (type)
	{
		case POLICY_PASS:
			return ESPD_ACTION_BYPASS;
		case POLICY_DROP:
			return ESPD_ACTION_DROP;
		default:
			return ESPD_ACTION_PROTECT;
	}
}

/**
 * Priority as charon's kernel-netlink computes it: a base per class, less
 * the selector's specificity; a manual priority wins.
 */
static uint32_t policy_priority(policy_entry_t *e, policy_user_t *u)
{
	const uint32_t base = 200000;
	uint32_t prio = base, spec;
	espd_msg_t m;

	if (u->manual_prio)
	{
		return u->manual_prio;
	}
	switch (u->prio)
	{
		case POLICY_PRIORITY_FALLBACK:
			prio += base;
			/* fall-through */
		case POLICY_PRIORITY_ROUTED:
		case POLICY_PRIORITY_DEFAULT:
			prio += base;
			/* fall-through */
		case POLICY_PRIORITY_PASS:
			break;
	}
	/* measure the selector by encoding it */
	spec = 0;
	if (espd_msg_init(&m, 0, 0))
	{
		spec = put_selector(&m, e->src_ts, e->dst_ts);
		espd_msg_free(&m);
	}
	prio -= spec;
	prio -= (u->prio != POLICY_PRIORITY_ROUTED);
	return prio;
}

/**
 * The request whose values espd should have: lowest priority, the newest
 * on a tie.
 */
static policy_user_t *best_user(policy_entry_t *e)
{
	enumerator_t *enumerator;
	policy_user_t *u, *best = NULL;

	enumerator = e->users->create_enumerator(e->users);
	while (enumerator->enumerate(enumerator, &u))
	{
		if (!best || u->priority <= best->priority)
		{
			best = u;
		}
	}
	enumerator->destroy(enumerator);
	return best;
}

/**
 * Append what names a policy in espd: selector, direction and interface ID.
 */
static void put_policy_id(espd_msg_t *m, policy_entry_t *e)
{
	put_selector(m, e->src_ts, e->dst_ts);
	espd_msg_u32(m, ESPD_A_DIR, dir2espd(e->dir));
	if (e->if_id)
	{
		espd_msg_u32(m, ESPD_A_IF_ID, e->if_id);
	}
}

/**
 * Send the best request's values to espd: POLICY_ADD if espd does not have
 * the policy, POLICY_UPDATE if it does. this->mutex is held.
 */
static status_t send_policy(private_espd_kernel_ipsec_t *this,
							policy_entry_t *e, uint32_t action,
							uint32_t priority, uint32_t reqid,
							host_t *src, host_t *dst, ipsec_mode_t mode);

static status_t install_policy(private_espd_kernel_ipsec_t *this,
							   policy_entry_t *e, bool force)
{
	policy_user_t *u = best_user(e);
	uint32_t action = type2action(u->type);

	if (e->installed && !force && e->inst_action == action &&
		e->inst_priority == u->priority && e->inst_reqid == u->reqid &&
		e->inst_mode == u->mode)
	{
		return SUCCESS;
	}
	return send_policy(this, e, action, u->priority, u->reqid, u->src, u->dst,
					   u->mode);
}

/**
 * Keep a policy that no request uses any more in espd as a drop policy,
 * with the priority and interface ID it had: its traffic is dropped (and
 * its prefix held) instead of leaving in clear until charon installs it
 * again. this->mutex is held.
 */
static status_t retain_policy(private_espd_kernel_ipsec_t *this,
							  policy_entry_t *e)
{
	if (e->installed && e->inst_action == ESPD_ACTION_DROP && !e->inst_reqid)
	{
		return SUCCESS;
	}
	return send_policy(this, e, ESPD_ACTION_DROP, e->inst_priority, 0,
					   NULL, NULL, MODE_TUNNEL);
}

/**
 * Send POLICY_ADD, or POLICY_UPDATE if espd has the policy, with these
 * values. this->mutex is held.
 */
static status_t send_policy(private_espd_kernel_ipsec_t *this,
							policy_entry_t *e, uint32_t action,
							uint32_t priority, uint32_t reqid,
							host_t *src, host_t *dst, ipsec_mode_t mode)
{
	espd_msg_t m;
	char what[256], ifid[IF_ID_STR_LEN];
	int r, attempt;
	uint16_t type;

	type = e->installed ? ESPD_MSG_POLICY_UPDATE : ESPD_MSG_POLICY_ADD;
	for (attempt = 0; attempt < 2; attempt++)
	{
		if (!espd_msg_init(&m, type, 0))
		{
			return FAILED;
		}
		put_policy_id(&m, e);
		espd_msg_u32(&m, ESPD_A_ACTION, action);
		espd_msg_u32(&m, ESPD_A_PRIORITY, priority);
		if (reqid)
		{
			espd_msg_u32(&m, ESPD_A_REQID, reqid);
		}
		if (src && !src->is_anyaddr(src) && dst && !dst->is_anyaddr(dst))
		{
			put_host(&m, ESPD_A_TMPL_SRC, src);
			put_host(&m, ESPD_A_TMPL_DST, dst);
		}
		if (mode == MODE_TRANSPORT)
		{
			/* the template's mode; absent: tunnel (as REQID and the
			 * template's addresses, sent only when not the default) */
			espd_msg_u32(&m, ESPD_A_MODE, ESPD_MODE_TRANSPORT);
		}
		snprintf(what, sizeof(what), "%s policy %R === %R %N%s%s",
				 type == ESPD_MSG_POLICY_ADD ? "adding" : "updating",
				 e->src_ts, e->dst_ts, policy_dir_names, e->dir,
				 format_if_id(ifid, sizeof(ifid), e->if_id),
				 mode == MODE_TRANSPORT ? " (transport mode)" : "");
		r = request(this, &m, NULL, NULL, what,
					type == ESPD_MSG_POLICY_ADD ? EEXIST : ENOENT);
		if (r == 0)
		{
			e->installed = TRUE;
			e->inst_action = action;
			e->inst_priority = priority;
			e->inst_reqid = reqid;
			e->inst_mode = mode;
			DBG2(DBG_KNL, "espd: %s", what);
			return SUCCESS;
		}
		/* espd has it (or not) after all: try the other message */
		if (r == EEXIST && type == ESPD_MSG_POLICY_ADD)
		{
			type = ESPD_MSG_POLICY_UPDATE;
		}
		else if (r == ENOENT && type == ESPD_MSG_POLICY_UPDATE)
		{
			type = ESPD_MSG_POLICY_ADD;
		}
		else
		{
			break;
		}
	}
	if (r == ENOENT)
	{
		DBG1(DBG_KNL, "espd: %s failed: no such policy", what);
	}
	return FAILED;
}

/**
 * Remove the policy from espd. this->mutex is held.
 */
static status_t uninstall_policy(private_espd_kernel_ipsec_t *this,
								 policy_entry_t *e)
{
	espd_msg_t m;
	char what[256], ifid[IF_ID_STR_LEN];
	int r;

	if (!e->installed)
	{
		return SUCCESS;
	}
	if (!espd_msg_init(&m, ESPD_MSG_POLICY_DEL, 0))
	{
		return FAILED;
	}
	put_policy_id(&m, e);
	snprintf(what, sizeof(what), "deleting policy %R === %R %N%s", e->src_ts,
			 e->dst_ts, policy_dir_names, e->dir,
			 format_if_id(ifid, sizeof(ifid), e->if_id));
	r = request(this, &m, NULL, NULL, what, ENOENT);
	e->installed = FALSE;
	if (r == 0 || r == ENOENT)
	{
		DBG2(DBG_KNL, "espd: %s", what);
		return SUCCESS;
	}
	return FAILED;
}

static void release_covered(private_espd_kernel_ipsec_t *this,
							policy_entry_t *e);

METHOD(kernel_ipsec_t, add_policy, status_t,
	private_espd_kernel_ipsec_t *this, kernel_ipsec_policy_id_t *id,
	kernel_ipsec_manage_policy_t *data)
{
	policy_entry_t key = { .dir = id->dir, .src_ts = id->src_ts,
						   .dst_ts = id->dst_ts, .if_id = id->if_id }, *e;
	policy_user_t *u;
	status_t status;

	if (id->label)
	{
		DBG1(DBG_KNL, "espd: security labels are not supported");
		return NOT_SUPPORTED;
	}
	if (id->src_ts->get_type(id->src_ts) != id->dst_ts->get_type(id->dst_ts))
	{
		DBG1(DBG_KNL, "espd: policy %R === %R mixes address families",
			 id->src_ts, id->dst_ts);
		return FAILED;
	}
	/* an interface ID (if_id_in, if_id_out) is part of the policy's
	 * identity in espd, as with XFRM interfaces */
	if (id->mark.value || id->mark.mask || id->interface)
	{
		DBG1(DBG_KNL, "espd: policy %R === %R %N: refused: %s is not "
			 "supported by espd, which would apply the policy to all of the "
			 "gateway's traffic it matches; see docs/strongswan.md, \"What "
			 "espd supports\"", id->src_ts, id->dst_ts, policy_dir_names,
			 id->dir, id->interface ? "an interface restriction (interface)" :
			 "a mark (mark_in, mark_out)");
		return NOT_SUPPORTED;
	}
#if ESPD_SS_VERSION >= 60000
	if (hw_offload_refused(data->hw_offload))
	{
		DBG1(DBG_KNL, "espd: policy %R === %R %N: refused: hw_offload = %s; "
			 "espd does the crypto itself (use hw_offload = no or auto)",
			 id->src_ts, id->dst_ts, policy_dir_names, id->dir,
			 hw_offload_name(data->hw_offload));
		return NOT_SUPPORTED;
	}
#endif
	if (data->sa && data->type == POLICY_IPSEC)
	{
		if (data->sa->ah.use || data->sa->ipcomp.transform != IPCOMP_NONE)
		{
			DBG1(DBG_KNL, "espd: policy %R === %R %N: refused: %s; espd "
				 "carries ESP only, without AH or IPComp", id->src_ts,
				 id->dst_ts, policy_dir_names, id->dir, data->sa->ah.use ?
				 "AH (ah_proposals)" : "IPComp (ipcomp = yes)");
			return NOT_SUPPORTED;
		}
		if (data->sa->mode != MODE_TUNNEL && data->sa->mode != MODE_TRANSPORT)
		{
			DBG1(DBG_KNL, "espd: policy %R === %R %N: refused: mode %N; espd "
				 "carries ESP in tunnel or transport mode only", id->src_ts,
				 id->dst_ts, policy_dir_names, id->dir, ipsec_mode_names,
				 data->sa->mode);
			return NOT_SUPPORTED;
		}
	}
	INIT(u,
		.type = data->type,
		.prio = data->prio,
		.manual_prio = data->manual_prio,
		.reqid = data->sa ? data->sa->reqid : 0,
		.src = data->src ? data->src->clone(data->src) : NULL,
		.dst = data->dst ? data->dst->clone(data->dst) : NULL,
		/* only an IPsec policy has a template whose mode matters; espd
		 * routes a transport-mode policy's traffic for whole datagrams */
		.mode = data->sa && data->type == POLICY_IPSEC &&
				data->sa->mode == MODE_TRANSPORT ? MODE_TRANSPORT : MODE_TUNNEL,
	);

	this->mutex->lock(this->mutex);
	e = this->policies->get(this->policies, &key);
	if (!e)
	{
		INIT(e,
			.dir = id->dir,
			.src_ts = id->src_ts->clone(id->src_ts),
			.dst_ts = id->dst_ts->clone(id->dst_ts),
			.if_id = id->if_id,
			.users = linked_list_create(),
		);
		this->policies->put(this->policies, e, e);
	}
	u->priority = policy_priority(e, u);
	e->users->insert_last(e->users, u);
	status = install_policy(this, e, FALSE);
	if (status == SUCCESS)
	{
		e->retained = FALSE;
		release_covered(this, e);
	}
	else
	{
		e->users->remove_last(e->users, (void**)&u);
		policy_user_destroy(u);
		if (e->users->get_count(e->users) == 0 && !e->retained)
		{
			this->policies->remove(this->policies, e);
			uninstall_policy(this, e);
			policy_entry_destroy(e);
		}
	}
	this->mutex->unlock(this->mutex);
	return status;
}

METHOD(kernel_ipsec_t, query_policy, status_t,
	private_espd_kernel_ipsec_t *this, kernel_ipsec_policy_id_t *id,
	kernel_ipsec_query_policy_t *data, time_t *use_time)
{
	/* espd keeps no per-policy use time; charon falls back to query_sa */
	return NOT_SUPPORTED;
}

/**
 * Whether ts lies within one of a child config's traffic selectors; a
 * dynamic one (a virtual IP, the host's address) stands for any address.
 */
static bool ts_covered(traffic_selector_t *ts, linked_list_t *list)
{
	enumerator_t *enumerator;
	traffic_selector_t *c;
	bool found = FALSE;

	enumerator = list->create_enumerator(list);
	while (!found && enumerator->enumerate(enumerator, &c))
	{
		found = c->is_dynamic(c) || ts->is_contained_in(ts, c);
	}
	enumerator->destroy(enumerator);
	return found;
}

/**
 * The interface ID of the outbound policies of a child config's CHILD_SAs:
 * its own if_id_out, else its connection's (as child_sa_create() takes
 * them). A %unique one (IF_ID_UNIQUE, IF_ID_UNIQUE_DIR) is allocated anew
 * for each CHILD_SA or IKE_SA and never equals an installed policy's: such
 * policies are not retained.
 */
static uint32_t child_if_id_out(peer_cfg_t *peer, child_cfg_t *child)
{
	return child->get_if_id(child, FALSE) ?: peer->get_if_id(peer, FALSE);
}

/**
 * The name of a loaded connection with a CHILD_SA config whose traffic
 * selectors cover an outbound policy from src_ts to dst_ts with interface
 * ID if_id (0: none), or NULL: such a policy's traffic must not leave in
 * clear while charon may negotiate it again (after a delete, a rekey
 * failure, its own restart). Only unloading the connection (or removing it
 * from swanctl.conf and --load-all) gives the traffic up. Not called with
 * this->mutex held: it takes the config backends' locks.
 */
static char *loaded_connection(traffic_selector_t *src_ts,
							   traffic_selector_t *dst_ts, uint32_t if_id,
							   char *buf, size_t len)
{
	enumerator_t *peers, *children;
	peer_cfg_t *peer;
	child_cfg_t *child;
	linked_list_t *local, *remote;
	bool found = FALSE;

	peers = charon->backends->create_peer_cfg_enumerator(charon->backends,
											NULL, NULL, NULL, NULL, IKE_ANY);
	while (!found && peers->enumerate(peers, &peer))
	{
		children = peer->create_child_cfg_enumerator(peer);
		while (!found && children->enumerate(children, &child))
		{
			if (child_if_id_out(peer, child) != if_id)
			{
				continue;
			}
			local = child->get_traffic_selectors(child, TRUE, NULL, NULL, FALSE);
			remote = child->get_traffic_selectors(child, FALSE, NULL, NULL, FALSE);
			found = ts_covered(src_ts, local) && ts_covered(dst_ts, remote);
			local->destroy_offset(local, offsetof(traffic_selector_t, destroy));
			remote->destroy_offset(remote, offsetof(traffic_selector_t, destroy));
			if (found)
			{
				snprintf(buf, len, "%s/%s", peer->get_name(peer),
						 child->get_name(child));
			}
		}
		children->destroy(children);
	}
	peers->destroy(peers);
	return found ? buf : NULL;
}

/**
 * Release the retained drop policies that a protect policy just installed
 * for e covers: its route into the TUN carries their traffic now. An
 * administrator who widened a connection's traffic selectors would
 * otherwise keep dropping the old, narrower ones. Only those of e's
 * interface ID: another's traffic is another interface's. this->mutex is
 * held.
 */
static void release_covered(private_espd_kernel_ipsec_t *this,
							policy_entry_t *e)
{
	enumerator_t *enumerator;
	policy_entry_t *o;
	char ifid[IF_ID_STR_LEN];

	if (e->dir != POLICY_OUT || e->inst_action != ESPD_ACTION_PROTECT)
	{
		return;
	}
	enumerator = this->policies->create_enumerator(this->policies);
	while (enumerator->enumerate(enumerator, NULL, &o))
	{
		if (o != e && o->retained && o->dir == POLICY_OUT &&
			o->if_id == e->if_id &&
			o->src_ts->is_contained_in(o->src_ts, e->src_ts) &&
			o->dst_ts->is_contained_in(o->dst_ts, e->dst_ts))
		{
			DBG1(DBG_KNL, "espd: policy %R === %R out%s replaces the drop "
				 "policy kept for %R === %R", e->src_ts, e->dst_ts,
				 format_if_id(ifid, sizeof(ifid), e->if_id), o->src_ts,
				 o->dst_ts);
			this->policies->remove_at(this->policies, enumerator);
			uninstall_policy(this, o);
			policy_entry_destroy(o);
		}
	}
	enumerator->destroy(enumerator);
}

/** how often kept drop policies are checked against the loaded connections */
#define RETAIN_CHECK_MS 2000

/**
 * A kept drop policy's selectors and interface ID, copied to be checked
 * without the mutex.
 */
typedef struct {
	traffic_selector_t *src_ts, *dst_ts;
	uint32_t if_id;
} ts_pair_t;

static void ts_pair_destroy(ts_pair_t *p)
{
	p->src_ts->destroy(p->src_ts);
	p->dst_ts->destroy(p->dst_ts);
	free(p);
}

/**
 * Delete the drop policies kept for connections that were unloaded since
 * (swanctl --unload-conn, or removed from swanctl.conf and --load-all):
 * their traffic is given up deliberately. Runs every RETAIN_CHECK_MS while
 * any policy is kept.
 */
static job_requeue_t check_retained(private_espd_kernel_ipsec_t *this)
{
	enumerator_t *enumerator;
	linked_list_t *kept = linked_list_create();
	policy_entry_t *e, key = { .dir = POLICY_OUT };
	ts_pair_t *p;
	char buf[128], ifid[IF_ID_STR_LEN];
	bool more = FALSE;

	this->mutex->lock(this->mutex);
	enumerator = this->policies->create_enumerator(this->policies);
	while (enumerator->enumerate(enumerator, NULL, &e))
	{
		if (e->retained && e->users->get_count(e->users) == 0)
		{
			INIT(p,
				.src_ts = e->src_ts->clone(e->src_ts),
				.dst_ts = e->dst_ts->clone(e->dst_ts),
				.if_id = e->if_id,
			);
			kept->insert_last(kept, p);
		}
	}
	enumerator->destroy(enumerator);
	this->mutex->unlock(this->mutex);

	enumerator = kept->create_enumerator(kept);
	while (enumerator->enumerate(enumerator, &p))
	{
		if (loaded_connection(p->src_ts, p->dst_ts, p->if_id, buf,
							  sizeof(buf)))
		{
			continue;
		}
		key.src_ts = p->src_ts;
		key.dst_ts = p->dst_ts;
		key.if_id = p->if_id;
		this->mutex->lock(this->mutex);
		e = this->policies->get(this->policies, &key);
		if (e && e->retained && e->users->get_count(e->users) == 0)
		{
			DBG1(DBG_KNL, "espd: no loaded connection covers %R === %R out%s "
				 "any more; deleting the drop policy kept for it",
				 e->src_ts, e->dst_ts,
				 format_if_id(ifid, sizeof(ifid), e->if_id));
			this->policies->remove(this->policies, e);
			uninstall_policy(this, e);
			policy_entry_destroy(e);
		}
		this->mutex->unlock(this->mutex);
	}
	enumerator->destroy(enumerator);
	kept->destroy_function(kept, (void*)ts_pair_destroy);

	this->mutex->lock(this->mutex);
	enumerator = this->policies->create_enumerator(this->policies);
	while (!more && enumerator->enumerate(enumerator, NULL, &e))
	{
		more = e->retained && e->users->get_count(e->users) == 0;
	}
	enumerator->destroy(enumerator);
	this->retain_check = more;
	this->mutex->unlock(this->mutex);
	return more ? JOB_RESCHEDULE_MS(RETAIN_CHECK_MS) : JOB_REQUEUE_NONE;
}

/**
 * Make sure check_retained() runs. this->mutex is held.
 */
static void schedule_retain_check(private_espd_kernel_ipsec_t *this)
{
	if (!this->retain_check)
	{
		this->retain_check = TRUE;
		lib->scheduler->schedule_job_ms(lib->scheduler, (job_t*)
				callback_job_create((callback_job_cb_t)check_retained, this,
									NULL, NULL), RETAIN_CHECK_MS);
	}
}

static bool user_matches(policy_user_t *u, kernel_ipsec_manage_policy_t *data,
						 bool exact)
{
	uint32_t reqid = data->sa ? data->sa->reqid : 0;

	if (u->type != data->type || u->prio != data->prio ||
		u->manual_prio != data->manual_prio || u->reqid != reqid)
	{
		return FALSE;
	}
	if (!exact)
	{
		return TRUE;
	}
	return (!u->src && !data->src) ||
		   (u->src && data->src && u->src->ip_equals(u->src, data->src) &&
			u->dst && data->dst && u->dst->ip_equals(u->dst, data->dst));
}

METHOD(kernel_ipsec_t, del_policy, status_t,
	private_espd_kernel_ipsec_t *this, kernel_ipsec_policy_id_t *id,
	kernel_ipsec_manage_policy_t *data)
{
	policy_entry_t key = { .dir = id->dir, .src_ts = id->src_ts,
						   .dst_ts = id->dst_ts, .if_id = id->if_id }, *e;
	enumerator_t *enumerator;
	policy_user_t *u, *found = NULL;
	status_t status = SUCCESS;
	char buf[128], ifid[IF_ID_STR_LEN], *conn = NULL;
	int pass;

	if (id->dir == POLICY_OUT)
	{
		conn = loaded_connection(id->src_ts, id->dst_ts, id->if_id, buf,
								 sizeof(buf));
	}
	format_if_id(ifid, sizeof(ifid), id->if_id);
	this->mutex->lock(this->mutex);
	e = this->policies->get(this->policies, &key);
	if (!e || (e->retained && e->users->get_count(e->users) == 0))
	{
		this->mutex->unlock(this->mutex);
		DBG1(DBG_KNL, "espd: deleting policy %R === %R %N%s: not installed",
			 id->src_ts, id->dst_ts, policy_dir_names, id->dir, ifid);
		return NOT_FOUND;
	}
	for (pass = 0; pass < 2 && !found; pass++)
	{
		enumerator = e->users->create_enumerator(e->users);
		while (enumerator->enumerate(enumerator, &u))
		{
			if (user_matches(u, data, pass == 0))
			{
				e->users->remove_at(e->users, enumerator);
				found = u;
				break;
			}
		}
		enumerator->destroy(enumerator);
	}
	if (!found)
	{
		this->mutex->unlock(this->mutex);
		DBG1(DBG_KNL, "espd: deleting policy %R === %R %N%s: no such "
			 "request", id->src_ts, id->dst_ts, policy_dir_names, id->dir,
			 ifid);
		return NOT_FOUND;
	}
	policy_user_destroy(found);
	if (e->users->get_count(e->users) == 0 && conn)
	{
		/* fail closed: keep dropping what the connection protected */
		e->retained = TRUE;
		schedule_retain_check(this);
		if (retain_policy(this, e) == SUCCESS)
		{
			DBG1(DBG_KNL, "espd: policy %R === %R out%s: its CHILD_SA is "
				 "gone but connection %s is loaded; espd drops its traffic "
				 "until charon installs it again (unload the connection to "
				 "let it go)", e->src_ts, e->dst_ts, ifid, conn);
		}
		/* espd away: reconcile() installs the drop policy when it is back */
	}
	else if (e->users->get_count(e->users) == 0)
	{
		this->policies->remove(this->policies, e);
		status = uninstall_policy(this, e);
		policy_entry_destroy(e);
	}
	else
	{
		status = install_policy(this, e, FALSE);
	}
	this->mutex->unlock(this->mutex);
	return status;
}

METHOD(kernel_ipsec_t, flush_policies, status_t,
	private_espd_kernel_ipsec_t *this)
{
	enumerator_t *enumerator;
	policy_entry_t *e;
	espd_msg_t m;

	this->mutex->lock(this->mutex);
	enumerator = this->policies->create_enumerator(this->policies);
	while (enumerator->enumerate(enumerator, NULL, &e))
	{
		this->policies->remove_at(this->policies, enumerator);
		policy_entry_destroy(e);
	}
	enumerator->destroy(enumerator);
	this->mutex->unlock(this->mutex);
	if (!espd_msg_init(&m, ESPD_MSG_POLICY_FLUSH, 0))
	{
		return FAILED;
	}
	return request(this, &m, NULL, NULL, "flushing policies", 0) == 0 ?
			SUCCESS : FAILED;
}

/** bit of an address family in ike_families and natt_families */
static u_int family_bit(int family)
{
	return family == AF_INET ? 1 : family == AF_INET6 ? 2 : 0;
}

/**
 * Without the IKE hand-off socket-default opens charon's IKE port and then
 * its NAT-T port for each address family. If it got the first and not the
 * second, say what is most likely wrong: espd holds the NAT-T port as its
 * ESP-in-UDP port (its default), and IKE will hang.
 */
static job_requeue_t check_natt(private_espd_kernel_ipsec_t *this)
{
	uint16_t natt = lib->settings->get_int(lib->settings, "%s.port_nat_t",
										   CHARON_NATT_PORT, lib->ns);
	u_int missing;

	this->mutex->lock(this->mutex);
	missing = this->ike_families & ~this->natt_families;
	this->mutex->unlock(this->mutex);
	if (missing)
	{
		DBG1(DBG_KNL, "espd: charon could not open its NAT-T port UDP %u "
			 "(%s%s%s): without the IKE hand-off that port is charon's, and "
			 "espd's ESP-in-UDP port (espd --udp-port, 4500 by default) must "
			 "be another one; is espd holding UDP %u? Run espd with "
			 "--udp-port 4501 (see docs/strongswan.md), or use the hand-off",
			 natt, missing & 1 ? "IPv4" : "", missing == 3 ? " and " : "",
			 missing & 2 ? "IPv6" : "", natt);
	}
	return JOB_REQUEUE_NONE;
}

METHOD(kernel_ipsec_t, bypass_socket, bool,
	private_espd_kernel_ipsec_t *this, int fd, int family)
{
	int mark = espd_settings.mark;
	struct sockaddr_storage ss;
	socklen_t sslen = sizeof(ss);
	uint16_t port = 0, ike;
	bool schedule = FALSE;

	if (getsockname(fd, (struct sockaddr*)&ss, &sslen) == 0)
	{
		if (ss.ss_family == AF_INET)
		{
			port = ntohs(((struct sockaddr_in*)&ss)->sin_port);
		}
		else if (ss.ss_family == AF_INET6)
		{
			port = ntohs(((struct sockaddr_in6*)&ss)->sin6_port);
		}
	}
	ike = lib->settings->get_int(lib->settings, "%s.port", CHARON_UDP_PORT,
								 lib->ns);
	if (port && port == ike)
	{
		this->mutex->lock(this->mutex);
		this->ike_families |= family_bit(family);
		schedule = !this->natt_check;
		this->natt_check = TRUE;
		this->mutex->unlock(this->mutex);
	}
	if (schedule)
	{
		/* socket-default opens the NAT-T sockets right after this one */
		lib->scheduler->schedule_job_ms(lib->scheduler, (job_t*)
				callback_job_create((callback_job_cb_t)check_natt, this,
									NULL, NULL), 1000);
	}

	/* espd's routing rule sends unmarked traffic through its table, whose
	 * routes lead into the TUN; IKE must not */
	if (setsockopt(fd, SOL_SOCKET, SO_MARK, &mark, sizeof(mark)) < 0)
	{
		DBG1(DBG_KNL, "espd: setting SO_MARK 0x%x on an IKE socket failed: "
			 "%s", espd_settings.mark, strerror(errno));
		return FALSE;
	}
	return TRUE;
}

METHOD(kernel_ipsec_t, enable_udp_decap, bool,
	private_espd_kernel_ipsec_t *this, int fd, int family, uint16_t port)
{
	this->mutex->lock(this->mutex);
	this->natt_families |= family_bit(family);
	this->mutex->unlock(this->mutex);
	DBG1(DBG_KNL, "espd: ESP-in-UDP on charon's own port %u cannot reach "
		 "espd; for NAT traversal run espd with --ike-handoff and set "
		 "charon.plugins.espd.ike_handoff = yes", port);
	return FALSE;
}

/**
 * SAs and policies to check after a reconnect.
 */
typedef struct {
	uint32_t spi;
	host_t *dst;
	bool inbound;
	uint32_t reqid;
} sa_ref_t;

/** how long a previous charon's peers wait for their connection to load */
#define ORPHAN_WAIT 30

/**
 * SA_LIST part: the outbound SAs that charon negotiated (NEGOTIATED) and
 * this plugin did not install, by their outer addresses.
 */
static void orphan_reply(void *ctx, const espd_hdr_t *h, const uint8_t *body,
						 size_t len)
{
	private_espd_kernel_ipsec_t *this = ctx;
	espd_iter_t it;
	espd_attr_t a;
	espd_addr_t src = {}, dst = {};
	uint32_t spi = 0, dir = 0, negotiated = 0;
	bool have_src = FALSE, have_dst = FALSE;
	sa_entry_t key = {}, *e;
	enumerator_t *enumerator;
	peer_t *p;
	host_t *me, *other;
	bool known = FALSE;

	espd_iter_init(&it, body, len);
	while (espd_iter_next(&it, &a))
	{
		switch (a.type)
		{
			case ESPD_A_SPI:
				espd_attr_u32(&a, &spi);
				break;
			case ESPD_A_DIR:
				espd_attr_u32(&a, &dir);
				break;
			case ESPD_A_NEGOTIATED:
				espd_attr_u32(&a, &negotiated);
				break;
			case ESPD_A_SRC:
				have_src = espd_attr_addr(&a, &src);
				break;
			case ESPD_A_DST:
				have_dst = espd_attr_addr(&a, &dst);
				break;
		}
	}
	if (dir != ESPD_DIR_OUT || !negotiated || !have_src || !have_dst)
	{
		return;
	}
	me = espd_addr2host(&src, 0);
	other = espd_addr2host(&dst, 0);
	if (!me || !other)
	{
		DESTROY_IF(me);
		DESTROY_IF(other);
		return;
	}
	key = (sa_entry_t){ .spi = spi, .dst = other };
	this->mutex->lock(this->mutex);
	e = this->sas->get(this->sas, &key);
	enumerator = this->orphan_peers->create_enumerator(this->orphan_peers);
	while (!e && !known && enumerator->enumerate(enumerator, &p))
	{
		known = p->me->ip_equals(p->me, me) && p->other->ip_equals(p->other, other);
	}
	enumerator->destroy(enumerator);
	if (!e && !known)
	{
		INIT(p, .me = me, .other = other);
		this->orphan_peers->insert_last(this->orphan_peers, p);
		me = other = NULL;
	}
	this->mutex->unlock(this->mutex);
	DESTROY_IF(me);
	DESTROY_IF(other);
}

/**
 * Whether charon has an IKE_SA with the peer.
 */
static bool has_ike_sa(host_t *other)
{
	enumerator_t *enumerator;
	ike_sa_t *ike_sa;
	bool found = FALSE;

	enumerator = charon->ike_sa_manager->create_enumerator(
											charon->ike_sa_manager, TRUE);
	while (!found && enumerator->enumerate(enumerator, &ike_sa))
	{
		found = other->ip_equals(other, ike_sa->get_other_host(ike_sa));
	}
	enumerator->destroy(enumerator);
	return found;
}

/**
 * Negotiate again with the peers of a previous charon's SAs. That charon
 * was killed: its peers still have the IKE_SAs and CHILD_SAs it had, and
 * learn that they are gone only at their DPD timeout (minutes with
 * Debian's timers) or at the next espd restart here, when their ESP
 * starts going nowhere. A new IKE_SA (with INITIAL_CONTACT) makes them
 * drop the old ones at once. A peer's CHILD_SA configs that charon would
 * bring up by itself (start_action trap or start) are initiated once their
 * connection is loaded, unless an IKE_SA with the peer exists by then;
 * checked every second for ORPHAN_WAIT seconds after espd was found.
 */
static job_requeue_t check_orphans(private_espd_kernel_ipsec_t *this)
{
	enumerator_t *peers, *children;
	peer_cfg_t *peer_cfg;
	child_cfg_t *child_cfg;
	peer_t *p;
	bool done, more;
	u_int started;

	for (;;)
	{
		this->mutex->lock(this->mutex);
		if (this->orphan_peers->remove_first(this->orphan_peers,
											 (void**)&p) != SUCCESS)
		{
			this->mutex->unlock(this->mutex);
			break;
		}
		this->mutex->unlock(this->mutex);

		done = has_ike_sa(p->other);
		started = 0;
		peers = charon->backends->create_peer_cfg_enumerator(charon->backends,
										p->me, p->other, NULL, NULL, IKEV2);
		while (!done && peers->enumerate(peers, &peer_cfg))
		{
			children = peer_cfg->create_child_cfg_enumerator(peer_cfg);
			while (children->enumerate(children, &child_cfg))
			{
				if (child_cfg->get_start_action(child_cfg) == ACTION_NONE)
				{
					continue;
				}
				DBG1(DBG_KNL, "espd: a previous charon had SAs with %H that "
					 "this one does not know; initiating %s/%s so that the "
					 "peer replaces them now", p->other,
					 peer_cfg->get_name(peer_cfg), child_cfg->get_name(child_cfg));
#if ESPD_SS_VERSION >= 60000
				/* no callback, so no level for it to filter */
				charon->controller->initiate(charon->controller,
						peer_cfg->get_ref(peer_cfg),
						child_cfg->get_ref(child_cfg), NULL, NULL,
						LEVEL_SILENT, 0, FALSE);
#else
				charon->controller->initiate(charon->controller,
						peer_cfg->get_ref(peer_cfg),
						child_cfg->get_ref(child_cfg), NULL, NULL, 0, FALSE);
#endif
				started++;
			}
			children->destroy(children);
			done = started > 0;
		}
		peers->destroy(peers);
		if (done || time_monotonic(NULL) >= this->orphans_until)
		{
			if (!done)
			{
				DBG1(DBG_KNL, "espd: a previous charon had SAs with %H; no "
					 "loaded connection initiates to it, so the peer keeps "
					 "them until its DPD", p->other);
			}
			peer_destroy(p);
			continue;
		}
		/* its connection is not loaded yet: again in a second */
		this->mutex->lock(this->mutex);
		this->orphan_peers->insert_last(this->orphan_peers, p);
		this->mutex->unlock(this->mutex);
		break;
	}
	this->mutex->lock(this->mutex);
	more = this->orphan_peers->get_count(this->orphan_peers) > 0;
	this->mutex->unlock(this->mutex);
	return more ? JOB_RESCHEDULE(1) : JOB_REQUEUE_NONE;
}

/**
 * On the first connection to espd: look for SAs a previous charon
 * negotiated (it was killed, espd kept them) and schedule check_orphans().
 */
static void find_orphans(private_espd_kernel_ipsec_t *this)
{
	espd_msg_t m;

	if (this->orphans_checked)
	{
		return;
	}
	this->orphans_checked = TRUE;
	if (!espd_msg_init(&m, ESPD_MSG_SA_LIST, 0) ||
		request(this, &m, orphan_reply, this, "listing SAs", 0) != 0)
	{
		return;
	}
	this->mutex->lock(this->mutex);
	this->orphans_until = time_monotonic(NULL) + ORPHAN_WAIT;
	if (this->orphan_peers->get_count(this->orphan_peers))
	{
		lib->scheduler->schedule_job(lib->scheduler, (job_t*)
				callback_job_create((callback_job_cb_t)check_orphans, this,
									NULL, NULL), 1);
	}
	this->mutex->unlock(this->mutex);
}

METHOD(espd_kernel_ipsec_t, reconcile, void,
	private_espd_kernel_ipsec_t *this)
{
	enumerator_t *enumerator;
	policy_entry_t *pe;
	sa_entry_t *se, key;
	sa_ref_t *refs, *ref;
	sa_stats_t st;
	u_int count, i, j, gone = 0, soft = 0, policies = 0;
	int r;

	find_orphans(this);

	/* policies first, so that no traffic leaks while charon replaces the
	 * SAs (its trap policies in particular must be back) */
	this->mutex->lock(this->mutex);
	enumerator = this->policies->create_enumerator(this->policies);
	while (enumerator->enumerate(enumerator, NULL, &pe))
	{
		pe->installed = FALSE;
		if (pe->users->get_count(pe->users) == 0)
		{
			if (pe->retained && retain_policy(this, pe) == SUCCESS)
			{
				policies++;
			}
			continue;
		}
		if (install_policy(this, pe, TRUE) == SUCCESS)
		{
			policies++;
		}
	}
	enumerator->destroy(enumerator);

	count = this->sas->get_count(this->sas);
	refs = calloc(count ?: 1, sizeof(*refs));
	i = 0;
	enumerator = this->sas->create_enumerator(this->sas);
	while (i < count && enumerator->enumerate(enumerator, NULL, &se))
	{
		refs[i++] = (sa_ref_t){
			.spi = se->spi,
			.dst = se->dst->clone(se->dst),
			.inbound = se->inbound,
			.reqid = se->reqid,
		};
	}
	enumerator->destroy(enumerator);
	this->mutex->unlock(this->mutex);
	count = i;

	for (i = 0; i < count; i++)
	{
		ref = &refs[i];
		st = (sa_stats_t){};
		r = get_sa(this, ref->spi, ref->dst, &st, TRUE);
		if (r < 0)
		{
			/* espd went away again; the next connection checks again */
			break;
		}
		if (r == ENOENT)
		{
			gone++;
			key = (sa_entry_t){ .spi = ref->spi, .dst = ref->dst };
			this->mutex->lock(this->mutex);
			se = this->sas->remove(this->sas, &key);
			this->mutex->unlock(this->mutex);
			if (se)
			{
				sa_entry_destroy(se);
			}
			/* one hard expire per CHILD_SA: its inbound SA, or the outbound
			 * one if the inbound SA is not known */
			if (!ref->inbound)
			{
				for (j = 0; j < count; j++)
				{
					if (refs[j].inbound && refs[j].reqid == ref->reqid)
					{
						break;
					}
				}
				if (j < count)
				{
					continue;
				}
			}
			DBG1(DBG_KNL, "espd: SA %.8x (reqid %u) died with espd; "
				 "raising a hard expire so that charon replaces it with "
				 "fresh keys", ref->spi, ref->reqid);
			charon->kernel->expire(charon->kernel, IPPROTO_ESP,
								   htonl(ref->spi), ref->dst, TRUE);
		}
		else if (r == 0 && st.state == ESPD_STATE_SOFT)
		{
			soft++;
			charon->kernel->expire(charon->kernel, IPPROTO_ESP,
								   htonl(ref->spi), ref->dst, FALSE);
		}
	}
	for (i = 0; i < count; i++)
	{
		refs[i].dst->destroy(refs[i].dst);
	}
	free(refs);
	if (policies || count)
	{
		DBG1(DBG_KNL, "espd: resynchronized: %u policies installed, %u of %u "
			 "SAs gone, %u soft-expired", policies, gone, count, soft);
	}
}

METHOD(espd_kernel_ipsec_t, forget_sa, void,
	private_espd_kernel_ipsec_t *this, uint32_t spi, host_t *dst)
{
	sa_entry_t key = { .spi = spi, .dst = dst }, *e;

	this->mutex->lock(this->mutex);
	e = this->sas->remove(this->sas, &key);
	this->mutex->unlock(this->mutex);
	if (e)
	{
		sa_entry_destroy(e);
	}
}

METHOD(kernel_ipsec_t, destroy, void,
	private_espd_kernel_ipsec_t *this)
{
	enumerator_t *enumerator;
	policy_entry_t *pe;
	sa_entry_t *se;

	if (this->events)
	{
		this->events->destroy(this->events);
	}
	enumerator = this->policies->create_enumerator(this->policies);
	while (enumerator->enumerate(enumerator, NULL, &pe))
	{
		policy_entry_destroy(pe);
	}
	enumerator->destroy(enumerator);
	this->policies->destroy(this->policies);
	enumerator = this->sas->create_enumerator(this->sas);
	while (enumerator->enumerate(enumerator, NULL, &se))
	{
		sa_entry_destroy(se);
	}
	enumerator->destroy(enumerator);
	this->sas->destroy(this->sas);
	this->orphan_peers->destroy_function(this->orphan_peers,
										 (void*)peer_destroy);
	espd_conn_destroy(this->conn);
	this->mutex->destroy(this->mutex);
	free(this);
}

/*
 * Described in header.
 */
espd_kernel_ipsec_t *espd_kernel_ipsec_create()
{
	private_espd_kernel_ipsec_t *this;

	INIT(this,
		.public = {
			.interface = {
				.get_features = _get_features,
				.get_spi = _get_spi,
				.get_cpi = _get_cpi,
				.add_sa = _add_sa,
				.update_sa = _update_sa,
				.query_sa = _query_sa,
				.del_sa = _del_sa,
				.flush_sas = _flush_sas,
				.add_policy = _add_policy,
				.query_policy = _query_policy,
				.del_policy = _del_policy,
				.flush_policies = _flush_policies,
				.bypass_socket = _bypass_socket,
				.enable_udp_decap = _enable_udp_decap,
				.destroy = _destroy,
			},
			.reconcile = _reconcile,
			.forget_sa = _forget_sa,
		},
		.conn = espd_conn_create(espd_settings.socket, espd_settings.timeout_ms,
								 "request"),
		.mutex = mutex_create(MUTEX_TYPE_DEFAULT),
		.sas = hashtable_create((hashtable_hash_t)sa_hash,
								(hashtable_equals_t)sa_equals, 32),
		.orphan_peers = linked_list_create(),
		.policies = hashtable_create((hashtable_hash_t)policy_hash,
									 (hashtable_equals_t)policy_equals, 32),
		.spi_min = lib->settings->get_int(lib->settings, "%s.spi_min",
										  0xc0000000, lib->ns),
		.spi_max = lib->settings->get_int(lib->settings, "%s.spi_max",
										  0xcfffffff, lib->ns),
	);
	if (this->spi_min > this->spi_max)
	{
		uint32_t t = this->spi_min;

		this->spi_min = this->spi_max;
		this->spi_max = t;
	}
	this->events = espd_events_create(&this->public);
	return &this->public;
}
