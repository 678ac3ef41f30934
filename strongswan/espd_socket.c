/*
 * Copyright (C) 2025 The espd authors
 *
 * This program is free software; you can redistribute it and/or modify it
 * under the terms of the GNU General Public License as published by the
 * Free Software Foundation; either version 2 of the License, or (at your
 * option) any later version.  See COPYING.
 */

/*
 * Why one file of about 700 lines: this is one strongSwan object, the
 * socket_t that carries charon's IKE packets over espd's hand-off (register,
 * receive, send, the packets held while espd is away), in strongSwan's
 * METHOD style over one private struct, which a split would have to publish.
 */

#include "espd_socket.h"
#include "espd_plugin.h"
#include "espd_conn.h"
#include "espd_host.h"

#include <errno.h>
#include <sys/socket.h>
#include <unistd.h>

#include <daemon.h>
#include <collections/linked_list.h>
#include <threading/mutex.h>
#include <threading/thread.h>

/**
 * IKE packets held while espd is away: at most this many, none older than
 * HELD_MAX_AGE seconds (charon retransmits more often than that while it
 * still cares about an exchange).
 */
#define HELD_MAX 32
#define HELD_MAX_AGE 90

typedef struct private_espd_socket_t private_espd_socket_t;

/**
 * An IKE packet charon sent while there was no hand-off connection.
 */
typedef struct {
	packet_t *packet;
	/** monotonic second charon last sent it */
	time_t sent;
} held_t;

/**
 * Private data.
 */
struct private_espd_socket_t {

	/**
	 * Public interface
	 */
	socket_t public;

	/**
	 * Registered hand-off connection, -1 if none. Only the receiving thread
	 * opens and closes it; a failed send shuts it down, which the receiver
	 * notices.
	 */
	int fd;

	/**
	 * Guards fd and seq, serializes writes
	 */
	mutex_t *mutex;

	/**
	 * Sequence number of the next IKE_PACKET we send
	 */
	uint32_t seq;

	/**
	 * IKE and NAT-T ports (espd's, once registered)
	 */
	uint16_t port, natt;

	/**
	 * Receive buffer
	 */
	uint8_t *buf;

	/**
	 * Monotonic time of the last "not connected" logs
	 */
	time_t recv_log, send_log;

	/**
	 * held_t: IKE packets charon sent while espd was away, oldest first,
	 * sent as soon as the hand-off is registered again (guarded by mutex)
	 */
	linked_list_t *held;

	/**
	 * Monotonic time charon started (the socket was created)
	 */
	time_t started;
};

/**
 * For this long after charon starts, an IKE_SA_INIT for which no
 * connection is loaded yet waits for one (wait_for_config()).
 */
#define STARTUP_GRACE 10

/**
 * Whether data (an IKE message, after the non-ESP marker on the NAT-T
 * port) is an IKE_SA_INIT request.
 */
static bool is_sa_init_request(chunk_t data)
{
	if (data.len >= 4 && !data.ptr[0] && !data.ptr[1] && !data.ptr[2] &&
		!data.ptr[3])
	{
		data = chunk_skip(data, 4);
	}
	/* IKE header: SPIs (16), next payload, version, exchange type, flags */
	return data.len >= 28 && data.ptr[17] >> 4 == 2 && data.ptr[18] == 34 &&
		   (data.ptr[19] & 0x08) && !(data.ptr[19] & 0x20);
}

/**
 * Whether a loaded connection may answer an IKE_SA_INIT from pkt's source
 * (IKEv2: the backends match no config version with IKE_ANY).
 */
static bool have_config(packet_t *pkt)
{
	enumerator_t *enumerator;
	peer_cfg_t *cfg;
	bool found;

	enumerator = charon->backends->create_peer_cfg_enumerator(charon->backends,
						pkt->get_destination(pkt), pkt->get_source(pkt),
						NULL, NULL, IKEV2);
	found = enumerator->enumerate(enumerator, &cfg);
	enumerator->destroy(enumerator);
	return found;
}

/**
 * Right after charon starts, swanctl --load-all (charon-systemd's
 * ExecStartPost) has not loaded the connections yet. A peer that
 * negotiates again at once (its close_action after this charon's
 * predecessor deleted the IKE_SA, on a restart or an upgrade) would get
 * NO_PROPOSAL_CHOSEN and, with the default keyingtries, give up. Such a
 * request waits until a connection for it is loaded, at most until
 * STARTUP_GRACE seconds after charon started; later requests go to charon
 * at once whatever it has loaded.
 */
static void wait_for_config(private_espd_socket_t *this, packet_t *pkt)
{
	bool old;

	if (time_monotonic(NULL) >= this->started + STARTUP_GRACE ||
		!is_sa_init_request(pkt->get_data(pkt)) || have_config(pkt))
	{
		return;
	}
	DBG1(DBG_NET, "espd: IKE_SA_INIT from %#H before any connection for it "
		 "is loaded; holding it up to %d s after charon's start for "
		 "swanctl --load-all", pkt->get_source(pkt), STARTUP_GRACE);
	while (time_monotonic(NULL) < this->started + STARTUP_GRACE &&
		   !have_config(pkt))
	{
		old = thread_cancelability(TRUE);
		usleep(100000);
		thread_cancelability(old);
	}
}

static void held_destroy(held_t *h)
{
	h->packet->destroy(h->packet);
	free(h);
}

static void put_host(espd_msg_t *m, uint16_t type, host_t *h)
{
	chunk_t c = h->get_address(h);

	if (c.len == 4 || c.len == 16)
	{
		espd_msg_put(m, type, c.ptr, c.len);
	}
	else
	{
		m->failed = TRUE;
	}
}

/**
 * Connect and register. Returns the socket or -errno.
 */
static int do_register(private_espd_socket_t *this, char *err, size_t errlen)
{
	espd_msg_t m;
	espd_hdr_t h;
	espd_iter_t it;
	espd_attr_t a;
	uint16_t port, natt;
	int fd, r;

	fd = espd_dial(espd_settings.socket, espd_settings.timeout_ms, err, errlen,
				   NULL, 0);
	if (fd < 0)
	{
		return fd;
	}
	if (!espd_msg_init(&m, ESPD_MSG_IKE_REGISTER, 1))
	{
		close(fd);
		return -ENOMEM;
	}
	espd_msg_finish(&m);
	r = espd_write_all(fd, m.buf, m.len, espd_settings.timeout_ms);
	espd_msg_free(&m);
	while (r == 0)
	{
		r = espd_read_msg(fd, this->buf, &h, espd_settings.timeout_ms,
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
			uint32_t code = espd_parse_error(this->buf + ESPD_HDR_LEN,
									h.length - ESPD_HDR_LEN, err, errlen);
			if (code == 95 /* EOPNOTSUPP */)
			{
				snprintf(err, errlen, "espd runs without --ike-handoff");
			}
			close(fd);
			return -EPROTO;
		}
		espd_iter_init(&it, this->buf + ESPD_HDR_LEN, h.length - ESPD_HDR_LEN);
		while (espd_iter_next(&it, &a))
		{
			if (a.type == ESPD_A_IKE_PORTS && espd_attr_pair(&a, &port, &natt))
			{
				if (port != this->port || natt != this->natt)
				{
					DBG1(DBG_NET, "espd: espd serves IKE on UDP %u and %u, "
						 "charon expected %u and %u", port, natt, this->port,
						 this->natt);
					this->port = port;
					this->natt = natt;
				}
			}
		}
		return fd;
	}
	snprintf(err, errlen, "IKE_REGISTER: %s", strerror(-r));
	close(fd);
	return r;
}

static void drop_fd(private_espd_socket_t *this)
{
	this->mutex->lock(this->mutex);
	if (this->fd >= 0)
	{
		close(this->fd);
		this->fd = -1;
	}
	this->mutex->unlock(this->mutex);
}

/**
 * Parse an IKE_PACKET espd sent.
 */
static packet_t *parse_packet(const uint8_t *body, size_t len)
{
	espd_iter_t it;
	espd_attr_t a, data = {};
	espd_addr_t src = {}, dst = {};
	uint16_t sport = 0, dport = 0;
	host_t *s, *d;
	packet_t *pkt;

	espd_iter_init(&it, body, len);
	while (espd_iter_next(&it, &a))
	{
		switch (a.type)
		{
			case ESPD_A_SRC:
				if (!espd_attr_addr(&a, &src))
				{
					src.len = 0;
				}
				break;
			case ESPD_A_DST:
				if (!espd_attr_addr(&a, &dst))
				{
					dst.len = 0;
				}
				break;
			case ESPD_A_IKE_PORTS:
				espd_attr_pair(&a, &sport, &dport);
				break;
			case ESPD_A_IKE_DATA:
				data = a;
				break;
		}
	}
	if (it.bad || !data.val)
	{
		return NULL;
	}
	s = espd_addr2host(&src, sport);
	d = espd_addr2host(&dst, dport);
	if (!s || !d)
	{
		DESTROY_IF(s);
		DESTROY_IF(d);
		return NULL;
	}
	pkt = packet_create();
	pkt->set_source(pkt, s);
	pkt->set_destination(pkt, d);
	pkt->set_data(pkt, chunk_clone(chunk_create((u_char*)data.val, data.len)));
	return pkt;
}

static void send_held(private_espd_socket_t *this);

METHOD(socket_t, receive, status_t,
	private_espd_socket_t *this, packet_t **out)
{
	char err[512];
	espd_hdr_t h;
	packet_t *pkt;
	bool old;
	int fd, r;

	for (;;)
	{
		this->mutex->lock(this->mutex);
		fd = this->fd;
		this->mutex->unlock(this->mutex);
		if (fd < 0)
		{
			err[0] = 0;
			fd = do_register(this, err, sizeof(err));
			if (fd < 0)
			{
				if (!this->recv_log ||
					time_monotonic(NULL) - this->recv_log >= 60)
				{
					this->recv_log = time_monotonic(NULL);
					DBG1(DBG_NET, "espd: no IKE hand-off from espd (%s); "
						 "charon can neither send nor receive IKE until it "
						 "is available", err);
				}
				old = thread_cancelability(TRUE);
				usleep(fd == -EPROTO ? 2000000 : 200000);
				thread_cancelability(old);
				continue;
			}
			this->mutex->lock(this->mutex);
			this->fd = fd;
			this->mutex->unlock(this->mutex);
			this->recv_log = this->send_log = 0;
			DBG1(DBG_NET, "espd: receiving IKE on UDP ports %u and %u from "
				 "espd at %s", this->port, this->natt, espd_settings.socket);
			send_held(this);
		}
		old = thread_cancelability(TRUE);
		r = espd_read_msg(fd, this->buf, &h, -1, espd_settings.timeout_ms);
		thread_cancelability(old);
		if (r < 0)
		{
			DBG1(DBG_NET, "espd: IKE hand-off connection lost (%s); "
				 "reconnecting", r == -ECONNRESET ? "closed" : strerror(-r));
			drop_fd(this);
			continue;
		}
		if (h.type == ESPD_MSG_IKE_PACKET && !(h.flags & ESPD_F_REPLY))
		{
			pkt = parse_packet(this->buf + ESPD_HDR_LEN,
							   h.length - ESPD_HDR_LEN);
			if (!pkt)
			{
				DBG1(DBG_NET, "espd: ignoring a malformed IKE_PACKET");
				continue;
			}
			DBG3(DBG_NET, "espd: received packet from %#H to %#H",
				 pkt->get_source(pkt), pkt->get_destination(pkt));
			wait_for_config(this, pkt);
			*out = pkt;
			return SUCCESS;
		}
		if (h.type == ESPD_MSG_IKE_UNREGISTER && !(h.flags & ESPD_F_REPLY))
		{
			/* another IKE daemon registered: two charons on one espd */
			DBG1(DBG_NET, "espd: another IKE daemon took over espd's IKE "
				 "hand-off; registering again in 5 s");
			drop_fd(this);
			old = thread_cancelability(TRUE);
			sleep(5);
			thread_cancelability(old);
			continue;
		}
		if (h.type == ESPD_MSG_ERROR)
		{
			espd_parse_error(this->buf + ESPD_HDR_LEN,
							 h.length - ESPD_HDR_LEN, err, sizeof(err));
			DBG1(DBG_NET, "espd: espd could not send an IKE packet: %s", err);
			if (h.seq == 0)
			{
				drop_fd(this);
			}
		}
	}
}

/**
 * Hold a copy of packet until the hand-off is back: charon's pending
 * exchanges (a MOBIKE update, a DPD, the CHILD_SA replacements behind them)
 * then continue at once instead of at charon's next retransmit, which with
 * the default settings can be half a minute away. A retransmit replaces the
 * copy it repeats. this->mutex held.
 */
static void hold_locked(private_espd_socket_t *this, packet_t *packet)
{
	enumerator_t *enumerator;
	chunk_t data = packet->get_data(packet), other;
	host_t *dst = packet->get_destination(packet);
	held_t *h;

	enumerator = this->held->create_enumerator(this->held);
	while (enumerator->enumerate(enumerator, &h))
	{
		other = h->packet->get_data(h->packet);
		if (chunk_equals(data, other) &&
			dst->equals(dst, h->packet->get_destination(h->packet)))
		{
			this->held->remove_at(this->held, enumerator);
			held_destroy(h);
			break;
		}
	}
	enumerator->destroy(enumerator);
	if (this->held->get_count(this->held) >= HELD_MAX &&
		this->held->remove_first(this->held, (void**)&h) == SUCCESS)
	{
		held_destroy(h);
	}
	INIT(h,
		.packet = packet->clone(packet),
		.sent = time_monotonic(NULL),
	);
	this->held->insert_last(this->held, h);
}

/**
 * Send packet over the hand-off connection. Returns 0, -ENOTCONN without a
 * connection, -EMSGSIZE if it does not fit a message or -errno of a failed
 * write (the connection is then shut down and the receiving thread
 * reconnects). this->mutex held.
 */
static int send_locked(private_espd_socket_t *this, packet_t *packet)
{
	host_t *src = packet->get_source(packet);
	host_t *dst = packet->get_destination(packet);
	chunk_t data = packet->get_data(packet);
	uint16_t sport = src->get_port(src);
	espd_msg_t m;
	int r;

	if (this->fd < 0)
	{
		return -ENOTCONN;
	}
	if (!sport)
	{
		sport = this->port;
	}
	if (!espd_msg_init(&m, ESPD_MSG_IKE_PACKET, 0))
	{
		return -ENOMEM;
	}
	if (!src->is_anyaddr(src))
	{
		put_host(&m, ESPD_A_SRC, src);
	}
	put_host(&m, ESPD_A_DST, dst);
	espd_msg_pair(&m, ESPD_A_IKE_PORTS, sport, dst->get_port(dst));
	espd_msg_put(&m, ESPD_A_IKE_DATA, data.ptr, data.len);
	if (++this->seq == 0)
	{
		this->seq = 1;
	}
	m.buf[12] = this->seq >> 24;
	m.buf[13] = this->seq >> 16;
	m.buf[14] = this->seq >> 8;
	m.buf[15] = this->seq;
	if (!espd_msg_finish(&m))
	{
		espd_msg_free(&m);
		return -EMSGSIZE;
	}
	r = espd_write_all(this->fd, m.buf, m.len, espd_settings.timeout_ms);
	if (r < 0)
	{
		/* the receiving thread notices and reconnects */
		shutdown(this->fd, SHUT_RDWR);
	}
	espd_msg_free(&m);
	return r;
}

/**
 * Send what was held while espd was away; called once the hand-off is
 * registered again.
 */
static void send_held(private_espd_socket_t *this)
{
	held_t *h;
	time_t now = time_monotonic(NULL);
	u_int sent = 0, stale = 0;
	int r;

	this->mutex->lock(this->mutex);
	while (this->held->remove_first(this->held, (void**)&h) == SUCCESS)
	{
		if (now - h->sent > HELD_MAX_AGE)
		{
			stale++;
			held_destroy(h);
			continue;
		}
		r = send_locked(this, h->packet);
		if (r < 0 && r != -EMSGSIZE && r != -ENOMEM)
		{
			/* the connection is gone again: keep it for the next one */
			this->held->insert_first(this->held, h);
			break;
		}
		if (r == 0)
		{
			sent++;
		}
		held_destroy(h);
	}
	this->mutex->unlock(this->mutex);
	if (sent || stale)
	{
		DBG1(DBG_NET, "espd: sent %u IKE packets charon sent while espd was "
			 "away (%u older than %d s dropped)", sent, stale, HELD_MAX_AGE);
	}
}

METHOD(socket_t, sender, status_t,
	private_espd_socket_t *this, packet_t *packet)
{
	host_t *dst = packet->get_destination(packet);
	bool log = FALSE;
	int r;

	this->mutex->lock(this->mutex);
	r = send_locked(this, packet);
	if (r == -ENOTCONN || (r < 0 && r != -EMSGSIZE && r != -ENOMEM))
	{
		hold_locked(this, packet);
		if (!this->send_log || time_monotonic(NULL) - this->send_log >= 60)
		{
			this->send_log = time_monotonic(NULL);
			log = TRUE;
		}
	}
	this->mutex->unlock(this->mutex);
	switch (r)
	{
		case 0:
			DBG3(DBG_NET, "espd: sent packet to %#H", dst);
			return SUCCESS;
		case -EMSGSIZE:
			DBG1(DBG_NET, "espd: IKE packet of %zu bytes does not fit a "
				 "message", packet->get_data(packet).len);
			return FAILED;
		case -ENOMEM:
			return FAILED;
		default:
			if (log)
			{
				DBG1(DBG_NET, "espd: cannot send IKE to %#H now (%s); "
					 "holding it and sending it as soon as espd is back",
					 dst, r == -ENOTCONN ? "no IKE hand-off connection to "
					 "espd" : strerror(-r));
			}
			/* sent later: charon's retransmit timer runs as usual */
			return SUCCESS;
	}
}

METHOD(socket_t, get_port, uint16_t,
	private_espd_socket_t *this, bool nat_t)
{
	return nat_t ? this->natt : this->port;
}

METHOD(socket_t, supported_families, socket_family_t,
	private_espd_socket_t *this)
{
	return SOCKET_FAMILY_BOTH;
}

/**
 * How long charon, stopping with IKE packets held, waits for espd to take
 * them: long enough for an espd restart (an upgrade restarts espd and
 * charon together), short beside systemd's stop timeout.
 */
#define HELD_EXIT_WAIT_MS 5000

/**
 * charon is stopping with IKE packets held, typically the deletes it sent
 * while espd restarted in the same upgrade: hand them to espd if it comes
 * back within HELD_EXIT_WAIT_MS. Lost, they would leave the peer sending
 * into SAs that no longer exist until its DPD gives up, minutes later.
 */
static void send_held_at_exit(private_espd_socket_t *this)
{
	char err[512] = "";
	u_int held = this->held->get_count(this->held);
	int fd, waited;

	if (!held)
	{
		return;
	}
	for (waited = 0; this->fd < 0 && waited < HELD_EXIT_WAIT_MS; waited += 100)
	{
		fd = do_register(this, err, sizeof(err));
		if (fd >= 0)
		{
			this->fd = fd;
			break;
		}
		usleep(100000);
	}
	if (this->fd >= 0)
	{
		send_held(this);
		return;
	}
	DBG1(DBG_NET, "espd: charon stops with %u IKE packets espd never took "
		 "(%s): the peer learns of these deletes only at its DPD", held, err);
}

METHOD(socket_t, destroy, void,
	private_espd_socket_t *this)
{
	send_held_at_exit(this);
	if (this->fd >= 0)
	{
		close(this->fd);
	}
	this->held->destroy_function(this->held, (void*)held_destroy);
	this->mutex->destroy(this->mutex);
	free(this->buf);
	free(this);
}

/*
 * Described in header.
 */
socket_t *espd_socket_create()
{
	private_espd_socket_t *this;

	INIT(this,
		.public = {
			.receive = _receive,
			.send = _sender,
			.get_port = _get_port,
			.supported_families = _supported_families,
			.destroy = _destroy,
		},
		.fd = -1,
		.mutex = mutex_create(MUTEX_TYPE_DEFAULT),
		.held = linked_list_create(),
		.started = time_monotonic(NULL),
		.buf = malloc(ESPD_MAX_MSG),
		.port = lib->settings->get_int(lib->settings, "%s.port",
									   CHARON_UDP_PORT, lib->ns),
		.natt = lib->settings->get_int(lib->settings, "%s.port_nat_t",
									   CHARON_NATT_PORT, lib->ns),
	);
	DBG1(DBG_NET, "espd: IKE goes through espd (UDP %u and %u are espd's)",
		 this->port, this->natt);
	return &this->public;
}
