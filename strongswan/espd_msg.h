/*
 * Copyright (C) 2025 The espd authors
 *
 * This program is free software; you can redistribute it and/or modify it
 * under the terms of the GNU General Public License as published by the
 * Free Software Foundation; either version 2 of the License, or (at your
 * option) any later version.  See COPYING.
 */

/**
 * espd control protocol codec (docs/control-protocol.md), version 1.
 *
 * Plain C without strongSwan dependencies, so that it can be tested on its
 * own. Builders write into a growing heap buffer that is wiped when freed
 * (SA_ADD carries keys); parsers walk attributes of a received message
 * without copying.
 */
#ifndef ESPD_MSG_H_
#define ESPD_MSG_H_

#include <stdint.h>
#include <stddef.h>
#include <stdbool.h>

#define ESPD_MAGIC 0xE5D0
#define ESPD_VERSION 1
#define ESPD_HDR_LEN 16
#define ESPD_MAX_MSG 65536
#define ESPD_MAX_NEST 4

/* header flags */
#define ESPD_F_REPLY 0x01
#define ESPD_F_MULTI 0x02

/* message types */
enum {
	ESPD_MSG_HELLO = 0x0001,
	ESPD_MSG_ERROR = 0x0002,
	ESPD_MSG_DONE = 0x0003,
	ESPD_MSG_EVENT = 0x0004,
	ESPD_MSG_SA_ADD = 0x0010,
	ESPD_MSG_SA_UPDATE = 0x0011,
	ESPD_MSG_SA_DEL = 0x0012,
	ESPD_MSG_SA_GET = 0x0013,
	ESPD_MSG_SA_LIST = 0x0014,
	ESPD_MSG_SA_FLUSH = 0x0015,
	ESPD_MSG_SPI_ALLOC = 0x0016,
	ESPD_MSG_POLICY_ADD = 0x0020,
	ESPD_MSG_POLICY_UPDATE = 0x0021,
	ESPD_MSG_POLICY_DEL = 0x0022,
	ESPD_MSG_POLICY_GET = 0x0023,
	ESPD_MSG_POLICY_LIST = 0x0024,
	ESPD_MSG_POLICY_FLUSH = 0x0025,
	ESPD_MSG_STATS = 0x0030,
	ESPD_MSG_SUBSCRIBE = 0x0031,
	ESPD_MSG_UNSUBSCRIBE = 0x0032,
	ESPD_MSG_IKE_REGISTER = 0x0040,
	ESPD_MSG_IKE_PACKET = 0x0041,
	ESPD_MSG_IKE_UNREGISTER = 0x0042,
};

/* top-level attributes */
enum {
	ESPD_A_SPI = 1,
	ESPD_A_SRC = 2,
	ESPD_A_DST = 3,
	ESPD_A_DIR = 4,
	ESPD_A_PROTO = 5,
	ESPD_A_MODE = 6,
	ESPD_A_REQID = 7,
	ESPD_A_ALG_NAME = 8,
	ESPD_A_ENC_ALG = 9,
	ESPD_A_ENC_KEYLEN = 10,
	ESPD_A_ENC_KEY = 11,
	ESPD_A_INTEG_ALG = 12,
	ESPD_A_INTEG_KEY = 13,
	ESPD_A_ESN = 14,
	ESPD_A_REPLAY_WINDOW = 15,
	ESPD_A_ENCAP = 16,
	ESPD_A_SELECTOR = 17,
	ESPD_A_LIFETIME_SOFT = 18,
	ESPD_A_LIFETIME_HARD = 19,
	ESPD_A_TTL = 20,
	ESPD_A_DSCP = 21,
	ESPD_A_COPY_DSCP = 22,
	ESPD_A_ECN = 23,
	ESPD_A_DF = 24,
	ESPD_A_TFC_PAD = 25,
	ESPD_A_SA_STATS = 26,
	ESPD_A_NEW_SRC = 27,
	ESPD_A_NEW_DST = 28,
	ESPD_A_OSEQ = 29,
	ESPD_A_REPLAY_SEQ = 30,
	ESPD_A_REPLAY_BITMAP = 31,
	ESPD_A_ACTION = 32,
	ESPD_A_PRIORITY = 33,
	ESPD_A_INDEX = 34,
	ESPD_A_TMPL_SRC = 35,
	ESPD_A_TMPL_DST = 36,
	/* u32 boolean: the keys were negotiated by IKE for this SA alone */
	ESPD_A_NEGOTIATED = 37,
	/* u32: interface ID (XFRM's if_id) of a route-based SA or policy;
	 * absent: 0, policy-based */
	ESPD_A_IF_ID = 38,
	ESPD_A_SPI_MIN = 40,
	ESPD_A_SPI_MAX = 41,
	ESPD_A_VERSION = 48,
	ESPD_A_SOFTWARE = 49,
	ESPD_A_MAX_MSG_SIZE = 50,
	ESPD_A_ERR_CODE = 56,
	ESPD_A_ERR_MSG = 57,
	ESPD_A_ERR_TYPE = 58,
	ESPD_A_ERR_ATTR = 59,
	ESPD_A_EVENT_TYPE = 72,
	ESPD_A_EXPIRE_REASON = 73,
	ESPD_A_FLOW = 74,
	ESPD_A_NEW_ADDR = 75,
	ESPD_A_NEW_PORT = 76,
	ESPD_A_EVENTS_LOST = 77,
	ESPD_A_EVENT_TIME = 78,
	ESPD_A_EVENT_MASK = 79,
	ESPD_A_IKE_PORTS = 80,
	ESPD_A_IKE_DATA = 81,
	ESPD_A_IKE_PORT = 82,
};

/* SELECTOR */
enum {
	ESPD_SEL_SRC = 1,
	ESPD_SEL_DST = 2,
	ESPD_SEL_PROTO = 3,
	ESPD_SEL_SRC_PORTS = 4,
	ESPD_SEL_DST_PORTS = 5,
};

/* LIFETIME_SOFT, LIFETIME_HARD */
enum {
	ESPD_LT_BYTES = 1,
	ESPD_LT_PACKETS = 2,
	ESPD_LT_ADD_TIME = 3,
	ESPD_LT_USE_TIME = 4,
};

/* SA_STATS */
enum {
	ESPD_ST_STATE = 1,
	ESPD_ST_PACKETS = 2,
	ESPD_ST_BYTES = 3,
	ESPD_ST_ADD_TIME = 4,
	ESPD_ST_USE_TIME = 5,
	ESPD_ST_SEQ_OUT = 6,
	ESPD_ST_REPLAY_TOP = 7,
	ESPD_ST_LAST_USE = 8,
	ESPD_ST_REPLAY_BITMAP = 9,
};

/* FLOW */
enum {
	ESPD_FL_SRC = 1,
	ESPD_FL_DST = 2,
	ESPD_FL_PROTO = 3,
	ESPD_FL_PORTS = 4,
};

/* values */
enum {
	ESPD_DIR_IN = 1,
	ESPD_DIR_OUT = 2,
	ESPD_DIR_FWD = 3,
	ESPD_MODE_TRANSPORT = 1,
	ESPD_MODE_TUNNEL = 2,
	ESPD_ACTION_PROTECT = 1,
	ESPD_ACTION_BYPASS = 2,
	ESPD_ACTION_DROP = 3,
	ESPD_DF_COPY = 0,
	ESPD_DF_SET = 1,
	ESPD_DF_CLEAR = 2,
	ESPD_EV_SOFT = 1,
	ESPD_EV_HARD = 2,
	ESPD_EV_ACQUIRE = 3,
	ESPD_EV_MAPPING = 4,
	ESPD_STATE_LARVAL = 1,
	ESPD_STATE_VALID = 2,
	ESPD_STATE_SOFT = 3,
	ESPD_STATE_DEAD = 4,
};

/**
 * An address as the protocol carries it: 4 or 16 bytes.
 */
typedef struct {
	uint8_t len; /* 4, 16; 0: absent */
	uint8_t b[16];
} espd_addr_t;

/**
 * A message being built.
 */
typedef struct {
	uint8_t *buf;
	size_t len, cap;
	size_t nest[ESPD_MAX_NEST];
	int depth;
	bool failed; /* out of memory or over ESPD_MAX_MSG */
} espd_msg_t;

/** Start a message of the given type, flags 0. */
bool espd_msg_init(espd_msg_t *m, uint16_t type, uint32_t seq);
/** Wipe and free the buffer. */
void espd_msg_free(espd_msg_t *m);
/** Append attributes. */
void espd_msg_put(espd_msg_t *m, uint16_t type, const void *val, size_t len);
void espd_msg_u32(espd_msg_t *m, uint16_t type, uint32_t v);
void espd_msg_u64(espd_msg_t *m, uint16_t type, uint64_t v);
void espd_msg_pair(espd_msg_t *m, uint16_t type, uint16_t a, uint16_t b);
void espd_msg_addr(espd_msg_t *m, uint16_t type, const espd_addr_t *a);
void espd_msg_prefix(espd_msg_t *m, uint16_t type, const espd_addr_t *a,
					 uint8_t bits);
void espd_msg_str(espd_msg_t *m, uint16_t type, const char *s);
/** Open a nested attribute; close it with espd_msg_end. */
void espd_msg_begin(espd_msg_t *m, uint16_t type);
void espd_msg_end(espd_msg_t *m);
/**
 * Patch the header's length. Returns false if building failed (memory,
 * size, unbalanced nesting).
 */
bool espd_msg_finish(espd_msg_t *m);

/**
 * A received header.
 */
typedef struct {
	uint16_t magic;
	uint8_t version, flags;
	uint16_t type, reserved;
	uint32_t length, seq;
} espd_hdr_t;

/**
 * Parse and check the 16 header bytes: magic, length a multiple of 4 in
 * 16..ESPD_MAX_MSG. Returns false on a framing error.
 */
bool espd_hdr_parse(const uint8_t *b, espd_hdr_t *h);

/**
 * An attribute.
 */
typedef struct {
	uint16_t type;
	uint16_t len; /* value length */
	const uint8_t *val;
} espd_attr_t;

/**
 * Iterator over a sequence of attributes (a message body or a nested
 * attribute's value).
 */
typedef struct {
	const uint8_t *p;
	size_t left;
	bool bad; /* framing error met */
} espd_iter_t;

void espd_iter_init(espd_iter_t *it, const uint8_t *p, size_t len);
/** Next attribute; false at the end or on a framing error (it->bad). */
bool espd_iter_next(espd_iter_t *it, espd_attr_t *a);
/** Iterate over a nested attribute's value. */
void espd_iter_nested(espd_iter_t *it, const espd_attr_t *a);

/** Typed readers: false on a wrong size. */
bool espd_attr_u32(const espd_attr_t *a, uint32_t *v);
bool espd_attr_u64(const espd_attr_t *a, uint64_t *v);
bool espd_attr_pair(const espd_attr_t *a, uint16_t *x, uint16_t *y);
bool espd_attr_addr(const espd_attr_t *a, espd_addr_t *addr);
/** Copy a string attribute into buf (NUL-terminated, truncated). */
void espd_attr_str(const espd_attr_t *a, char *buf, size_t size);

/** Name of an errno-style code for logs ("ENOENT", ...). */
const char *espd_errno_name(uint32_t code);

#endif /* ESPD_MSG_H_ */
