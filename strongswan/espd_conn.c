/*
 * Copyright (C) 2025 The espd authors
 *
 * This program is free software; you can redistribute it and/or modify it
 * under the terms of the GNU General Public License as published by the
 * Free Software Foundation; either version 2 of the License, or (at your
 * option) any later version.  See COPYING.
 */

#include "espd_conn.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <library.h>
#include <utils/debug.h>
#include <threading/mutex.h>

struct espd_conn_t {
	char *path;
	char *name;
	int timeout_ms;
	int fd;
	uint32_t seq;
	mutex_t *mutex;
	/* receive buffer, ESPD_MAX_MSG bytes, wiped after each exchange */
	uint8_t *buf;
	/* monotonic second of the last "cannot connect" log */
	time_t last_log;
};

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* wait for events on fd until deadline (ms, monotonic; -1: forever) */
static int wait_fd(int fd, short events, int64_t deadline)
{
	struct pollfd pfd = { .fd = fd, .events = events };
	int left, r;

	for (;;)
	{
		left = -1;
		if (deadline >= 0)
		{
			left = deadline - now_ms();
			if (left <= 0)
			{
				return -ETIMEDOUT;
			}
		}
		r = poll(&pfd, 1, left);
		if (r > 0)
		{
			return 0;
		}
		if (r == 0)
		{
			return -ETIMEDOUT;
		}
		if (errno != EINTR)
		{
			return -errno;
		}
	}
}

int espd_write_all(int fd, const uint8_t *buf, size_t len, int timeout_ms)
{
	int64_t deadline = now_ms() + timeout_ms;
	ssize_t n;
	int r;

	while (len > 0)
	{
		n = send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n > 0)
		{
			buf += n;
			len -= n;
			continue;
		}
		if (n < 0 && errno == EINTR)
		{
			continue;
		}
		if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
		{
			return -errno;
		}
		r = wait_fd(fd, POLLOUT, deadline);
		if (r < 0)
		{
			return r;
		}
	}
	return 0;
}

/* read exactly len bytes before deadline */
static int read_full(int fd, uint8_t *buf, size_t len, int64_t deadline)
{
	ssize_t n;
	int r;

	while (len > 0)
	{
		r = wait_fd(fd, POLLIN, deadline);
		if (r < 0)
		{
			return r;
		}
		n = recv(fd, buf, len, MSG_DONTWAIT);
		if (n > 0)
		{
			buf += n;
			len -= n;
			continue;
		}
		if (n == 0)
		{
			return -ECONNRESET;
		}
		if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)
		{
			return -errno;
		}
	}
	return 0;
}

int espd_read_msg(int fd, uint8_t *buf, espd_hdr_t *h, int first_ms,
				  int rest_ms)
{
	int64_t deadline = first_ms < 0 ? -1 : now_ms() + first_ms;
	int r;

	r = read_full(fd, buf, 1, deadline);
	if (r < 0)
	{
		return r;
	}
	deadline = now_ms() + rest_ms;
	r = read_full(fd, buf + 1, ESPD_HDR_LEN - 1, deadline);
	if (r < 0)
	{
		return r;
	}
	if (!espd_hdr_parse(buf, h))
	{
		return -EBADMSG;
	}
	return read_full(fd, buf + ESPD_HDR_LEN, h->length - ESPD_HDR_LEN,
					 deadline);
}

uint32_t espd_parse_error(const uint8_t *body, size_t len, char *msg,
						  size_t msglen)
{
	espd_iter_t it;
	espd_attr_t a;
	uint32_t code = 5 /* EIO */;

	if (msglen)
	{
		snprintf(msg, msglen, "(no message)");
	}
	espd_iter_init(&it, body, len);
	while (espd_iter_next(&it, &a))
	{
		if (a.type == ESPD_A_ERR_CODE)
		{
			espd_attr_u32(&a, &code);
		}
		else if (a.type == ESPD_A_ERR_MSG && msglen)
		{
			espd_attr_str(&a, msg, msglen);
		}
	}
	return code;
}

/* describe the server from its HELLO reply's attributes */
static void describe_server(const uint8_t *body, size_t len, char *server,
							size_t serverlen)
{
	espd_iter_t it;
	espd_attr_t a;
	char software[64] = "unknown software";
	uint32_t version = 0;

	espd_iter_init(&it, body, len);
	while (espd_iter_next(&it, &a))
	{
		if (a.type == ESPD_A_SOFTWARE)
		{
			espd_attr_str(&a, software, sizeof(software));
		}
		else if (a.type == ESPD_A_VERSION)
		{
			espd_attr_u32(&a, &version);
		}
	}
	snprintf(server, serverlen, "%s, control protocol %u", software, version);
}

int espd_dial(const char *path, int timeout_ms, char *err, size_t errlen,
			  char *server, size_t serverlen)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	uint8_t *buf;
	espd_msg_t m;
	espd_hdr_t h;
	char msg[256];
	int fd, r;

	if (strlen(path) >= sizeof(addr.sun_path))
	{
		snprintf(err, errlen, "socket path %s too long", path);
		return -ENAMETOOLONG;
	}
	strcpy(addr.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
	{
		r = -errno;
		snprintf(err, errlen, "socket: %s", strerror(errno));
		return r;
	}
	if (connect(fd, (struct sockaddr*)&addr, sizeof(addr)) < 0)
	{
		r = -errno;
		snprintf(err, errlen, "connect %s: %s", path, strerror(errno));
		close(fd);
		return r;
	}
	if (!espd_msg_init(&m, ESPD_MSG_HELLO, 1))
	{
		close(fd);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	espd_msg_u32(&m, ESPD_A_VERSION, ESPD_VERSION);
	espd_msg_finish(&m);
	r = espd_write_all(fd, m.buf, m.len, timeout_ms);
	espd_msg_free(&m);
	buf = malloc(ESPD_MAX_MSG);
	while (r == 0 && buf)
	{
		r = espd_read_msg(fd, buf, &h, timeout_ms, timeout_ms);
		if (r < 0)
		{
			break;
		}
		if (h.type == ESPD_MSG_ERROR)
		{
			uint32_t code = espd_parse_error(buf + ESPD_HDR_LEN,
									h.length - ESPD_HDR_LEN, msg, sizeof(msg));
			snprintf(err, errlen, "espd refused the connection: %s (%s)",
					 msg, espd_errno_name(code));
			free(buf);
			close(fd);
			return -EACCES;
		}
		if (h.type == ESPD_MSG_HELLO && (h.flags & ESPD_F_REPLY))
		{
			if (server && serverlen)
			{
				describe_server(buf + ESPD_HDR_LEN, h.length - ESPD_HDR_LEN,
								server, serverlen);
			}
			free(buf);
			return fd;
		}
	}
	free(buf);
	if (r == 0)
	{
		r = -ENOMEM;
	}
	snprintf(err, errlen, "HELLO to %s: %s", path, strerror(-r));
	close(fd);
	return r;
}

espd_conn_t *espd_conn_create(const char *path, int timeout_ms,
							  const char *name)
{
	espd_conn_t *c;

	INIT(c,
		.path = strdup(path),
		.name = strdup(name),
		.timeout_ms = timeout_ms,
		.fd = -1,
		.mutex = mutex_create(MUTEX_TYPE_DEFAULT),
		.buf = malloc(ESPD_MAX_MSG),
	);
	return c;
}

/* close the socket; c->mutex held */
static void reset_locked(espd_conn_t *c)
{
	if (c->fd >= 0)
	{
		close(c->fd);
		c->fd = -1;
	}
}

void espd_conn_reset(espd_conn_t *c)
{
	c->mutex->lock(c->mutex);
	reset_locked(c);
	c->mutex->unlock(c->mutex);
}

/* what one attempt of an exchange ended with */
typedef enum {
	EXCHANGE_DONE,		/* result is final */
	EXCHANGE_STALE,		/* connection was dead before anything came back */
	EXCHANGE_BROKEN,	/* connection failed during the exchange */
} exchange_t;

/* one attempt at an exchange on c->fd; c->mutex held */
static exchange_t exchange(espd_conn_t *c, espd_msg_t *req, espd_reply_cb_t cb,
						   void *ctx, char *err, size_t errlen, int *result)
{
	espd_hdr_t h;
	uint32_t seq;
	bool got_reply = FALSE;
	int r;

	seq = ++c->seq;
	if (seq == 0)
	{
		seq = c->seq = 1;
	}
	/* the sequence number sits at offset 12 */
	req->buf[12] = seq >> 24;
	req->buf[13] = seq >> 16;
	req->buf[14] = seq >> 8;
	req->buf[15] = seq;
	r = espd_write_all(c->fd, req->buf, req->len, c->timeout_ms);
	if (r < 0)
	{
		snprintf(err, errlen, "sending to espd: %s", strerror(-r));
		*result = r;
		return r == -EPIPE || r == -ECONNRESET || r == -ENOTCONN ?
				EXCHANGE_STALE : EXCHANGE_BROKEN;
	}
	*result = 0;
	for (;;)
	{
		r = espd_read_msg(c->fd, c->buf, &h, c->timeout_ms, c->timeout_ms);
		if (r < 0)
		{
			snprintf(err, errlen, "reading espd's reply: %s",
					 r == -ETIMEDOUT ? "timed out" :
					 r == -ECONNRESET ? "connection closed" : strerror(-r));
			*result = r;
			return r == -ECONNRESET && !got_reply ? EXCHANGE_STALE
												  : EXCHANGE_BROKEN;
		}
		got_reply = TRUE;
		if (!(h.flags & ESPD_F_REPLY) || h.seq != seq)
		{
			if (h.type == ESPD_MSG_ERROR && h.seq == 0)
			{
				/* connection-level error: espd is closing the connection */
				espd_parse_error(c->buf + ESPD_HDR_LEN,
								 h.length - ESPD_HDR_LEN, err, errlen);
				*result = -ECONNRESET;
				return EXCHANGE_BROKEN;
			}
			continue;
		}
		if (h.type == ESPD_MSG_ERROR)
		{
			*result = espd_parse_error(c->buf + ESPD_HDR_LEN,
									   h.length - ESPD_HDR_LEN, err, errlen);
			if (*result == 0)
			{
				*result = 5;
			}
			break;
		}
		if (h.type == ESPD_MSG_DONE)
		{
			break;
		}
		if (cb)
		{
			cb(ctx, &h, c->buf + ESPD_HDR_LEN, h.length - ESPD_HDR_LEN);
		}
		if (!(h.flags & ESPD_F_MULTI))
		{
			break;
		}
	}
	memwipe(c->buf, ESPD_HDR_LEN);
	return EXCHANGE_DONE;
}

int espd_conn_request(espd_conn_t *c, espd_msg_t *req, espd_reply_cb_t cb,
					  void *ctx, char *err, size_t errlen)
{
	bool fresh;
	int attempt, result = 0;
	exchange_t x;

	c->mutex->lock(c->mutex);
	if (!espd_msg_finish(req))
	{
		snprintf(err, errlen, "request could not be encoded");
		c->mutex->unlock(c->mutex);
		return -EINVAL;
	}
	/* a connection that died with a previous espd fails before anything
	 * comes back: then reconnect once and retry */
	for (attempt = 0; attempt < 2; attempt++)
	{
		fresh = FALSE;
		if (c->fd < 0)
		{
			c->fd = espd_dial(c->path, c->timeout_ms, err, errlen, NULL, 0);
			if (c->fd < 0)
			{
				result = c->fd;
				c->fd = -1;
				if (time_monotonic(NULL) != c->last_log)
				{
					c->last_log = time_monotonic(NULL);
					DBG1(DBG_KNL, "espd: %s connection: %s (is espd running?)",
						 c->name, err);
				}
				break;
			}
			fresh = TRUE;
			DBG2(DBG_KNL, "espd: %s connection to %s established", c->name,
				 c->path);
		}
		x = exchange(c, req, cb, ctx, err, errlen, &result);
		if (x == EXCHANGE_DONE)
		{
			break;
		}
		reset_locked(c);
		if (x == EXCHANGE_BROKEN || fresh)
		{
			break;
		}
	}
	c->mutex->unlock(c->mutex);
	return result;
}

void espd_conn_destroy(espd_conn_t *c)
{
	if (!c)
	{
		return;
	}
	reset_locked(c);
	c->mutex->destroy(c->mutex);
	free(c->buf);
	free(c->path);
	free(c->name);
	free(c);
}
