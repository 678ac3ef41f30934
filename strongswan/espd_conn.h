/*
 * Copyright (C) 2025 The espd authors
 *
 * This program is free software; you can redistribute it and/or modify it
 * under the terms of the GNU General Public License as published by the
 * Free Software Foundation; either version 2 of the License, or (at your
 * option) any later version.  See COPYING.
 */

/**
 * Connections to espd's control socket.
 *
 * espd_conn_t is a request/reply connection shared by charon's threads: one
 * request at a time (a mutex), every read and write bounded by a timeout,
 * reconnected on the next request after any failure. The lower-level
 * functions serve the plugin's long-lived connections (events, IKE
 * hand-off), each owned by one thread.
 */
#ifndef ESPD_CONN_H_
#define ESPD_CONN_H_

#include "espd_msg.h"

#include <sys/types.h>

/** Default socket path (espd --socket). */
#define ESPD_DEFAULT_SOCKET "/run/espd/espd.sock"

/**
 * Return codes of espd_conn_request: 0 on success, a positive errno value
 * the daemon answered with (ERROR reply), or a negative errno for a
 * transport failure (daemon not running, timeout, connection lost).
 */
typedef struct espd_conn_t espd_conn_t;

/**
 * Called for the reply to a request: once for a single reply, once per part
 * of a multi-part reply. body/len are the reply's attributes.
 */
typedef void (*espd_reply_cb_t)(void *ctx, const espd_hdr_t *h,
								const uint8_t *body, size_t len);

/**
 * Create a (not yet connected) request connection.
 *
 * @param path		control socket path
 * @param timeout_ms	bound for each read and write of an exchange
 * @param name		label for logs
 */
espd_conn_t *espd_conn_create(const char *path, int timeout_ms,
							  const char *name);

/**
 * Send req (espd_msg_finish'ed here) and collect the reply. Connects (and
 * says HELLO) first if needed. err receives a description on failure.
 */
int espd_conn_request(espd_conn_t *c, espd_msg_t *req, espd_reply_cb_t cb,
					  void *ctx, char *err, size_t errlen);

/** Close the connection; the next request reconnects. */
void espd_conn_reset(espd_conn_t *c);

/** Close and free. */
void espd_conn_destroy(espd_conn_t *c);

/**
 * Connect to path and exchange HELLO (version 1), each step bounded by
 * timeout_ms. Returns the socket or -errno; err describes a failure. If
 * server is not NULL it receives what espd's HELLO reply says about it,
 * e.g. "espd, control protocol 1".
 */
int espd_dial(const char *path, int timeout_ms, char *err, size_t errlen,
			  char *server, size_t serverlen);

/**
 * Write all of buf within timeout_ms. Returns 0 or -errno.
 */
int espd_write_all(int fd, const uint8_t *buf, size_t len, int timeout_ms);

/**
 * Read one message into buf (ESPD_MAX_MSG bytes). timeout_ms bounds the wait
 * for its first byte (-1: forever, a cancellation point) and, separately,
 * the rest of it. Returns 0, or -errno (-ECONNRESET on EOF, -EBADMSG on a
 * framing error).
 */
int espd_read_msg(int fd, uint8_t *buf, espd_hdr_t *h, int first_ms,
				  int rest_ms);

/**
 * Describe an ERROR message body: code and message. Returns the code.
 */
uint32_t espd_parse_error(const uint8_t *body, size_t len, char *msg,
						  size_t msglen);

#endif /* ESPD_CONN_H_ */
