/*
 * Copyright (C) 2025 The espd authors
 *
 * This program is free software; you can redistribute it and/or modify it
 * under the terms of the GNU General Public License as published by the
 * Free Software Foundation; either version 2 of the License, or (at your
 * option) any later version.  See COPYING.
 */

#include "espd_msg.h"

#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>

static void put16(uint8_t *p, uint16_t v)
{
	p[0] = v >> 8;
	p[1] = v;
}

static void put32(uint8_t *p, uint32_t v)
{
	p[0] = v >> 24;
	p[1] = v >> 16;
	p[2] = v >> 8;
	p[3] = v;
}

static uint16_t get16(const uint8_t *p)
{
	return (uint16_t)p[0] << 8 | p[1];
}

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 |
		   (uint32_t)p[2] << 8 | p[3];
}

/* wipe memory the compiler may not optimize away */
static void wipe(void *p, size_t n)
{
	volatile uint8_t *v = p;

	while (n--)
	{
		*v++ = 0;
	}
}

/* make room for n more bytes */
static uint8_t *grow(espd_msg_t *m, size_t n)
{
	uint8_t *nb;
	size_t cap;

	if (m->failed)
	{
		return NULL;
	}
	if (m->len + n > ESPD_MAX_MSG)
	{
		m->failed = true;
		return NULL;
	}
	if (m->len + n > m->cap)
	{
		cap = m->cap ? m->cap : 256;
		while (cap < m->len + n)
		{
			cap *= 2;
		}
		/* no realloc: the old buffer may hold keys and must be wiped */
		nb = malloc(cap);
		if (!nb)
		{
			m->failed = true;
			return NULL;
		}
		memcpy(nb, m->buf, m->len);
		wipe(m->buf, m->cap);
		free(m->buf);
		m->buf = nb;
		m->cap = cap;
	}
	memset(m->buf + m->len, 0, n);
	m->len += n;
	return m->buf + m->len - n;
}

bool espd_msg_init(espd_msg_t *m, uint16_t type, uint32_t seq)
{
	uint8_t *h;

	memset(m, 0, sizeof(*m));
	h = grow(m, ESPD_HDR_LEN);
	if (!h)
	{
		return false;
	}
	put16(h, ESPD_MAGIC);
	h[2] = ESPD_VERSION;
	h[3] = 0;
	put16(h + 4, type);
	put32(h + 12, seq);
	return true;
}

void espd_msg_free(espd_msg_t *m)
{
	if (m->buf)
	{
		wipe(m->buf, m->cap);
		free(m->buf);
	}
	memset(m, 0, sizeof(*m));
}

void espd_msg_put(espd_msg_t *m, uint16_t type, const void *val, size_t len)
{
	uint8_t *p;

	if (len > 0xFFFF - 4)
	{
		m->failed = true;
		return;
	}
	p = grow(m, (4 + len + 3) & ~(size_t)3);
	if (!p)
	{
		return;
	}
	put16(p, 4 + len);
	put16(p + 2, type);
	if (len)
	{
		memcpy(p + 4, val, len);
	}
}

void espd_msg_u32(espd_msg_t *m, uint16_t type, uint32_t v)
{
	uint8_t b[4];

	put32(b, v);
	espd_msg_put(m, type, b, 4);
}

void espd_msg_u64(espd_msg_t *m, uint16_t type, uint64_t v)
{
	uint8_t b[8];

	put32(b, v >> 32);
	put32(b + 4, v);
	espd_msg_put(m, type, b, 8);
}

void espd_msg_pair(espd_msg_t *m, uint16_t type, uint16_t a, uint16_t b)
{
	uint8_t v[4];

	put16(v, a);
	put16(v + 2, b);
	espd_msg_put(m, type, v, 4);
}

void espd_msg_addr(espd_msg_t *m, uint16_t type, const espd_addr_t *a)
{
	if (a->len != 4 && a->len != 16)
	{
		m->failed = true;
		return;
	}
	espd_msg_put(m, type, a->b, a->len);
}

void espd_msg_prefix(espd_msg_t *m, uint16_t type, const espd_addr_t *a,
					 uint8_t bits)
{
	uint8_t v[20] = { 0 };

	if ((a->len != 4 && a->len != 16) || bits > a->len * 8)
	{
		m->failed = true;
		return;
	}
	v[0] = bits;
	memcpy(v + 4, a->b, a->len);
	espd_msg_put(m, type, v, 4 + a->len);
}

void espd_msg_str(espd_msg_t *m, uint16_t type, const char *s)
{
	espd_msg_put(m, type, s, strlen(s));
}

void espd_msg_begin(espd_msg_t *m, uint16_t type)
{
	uint8_t *p;

	if (m->depth >= ESPD_MAX_NEST)
	{
		m->failed = true;
		return;
	}
	p = grow(m, 4);
	if (!p)
	{
		return;
	}
	put16(p + 2, type);
	m->nest[m->depth++] = m->len - 4;
}

void espd_msg_end(espd_msg_t *m)
{
	size_t start, len;

	if (m->failed || m->depth == 0)
	{
		m->failed = true;
		return;
	}
	start = m->nest[--m->depth];
	len = m->len - start;
	if (len > 0xFFFF)
	{
		m->failed = true;
		return;
	}
	/* nested values are a sequence of padded attributes: no padding here */
	put16(m->buf + start, len);
}

bool espd_msg_finish(espd_msg_t *m)
{
	if (m->failed || m->depth != 0 || !m->buf)
	{
		return false;
	}
	put32(m->buf + 8, m->len);
	return true;
}

bool espd_hdr_parse(const uint8_t *b, espd_hdr_t *h)
{
	h->magic = get16(b);
	h->version = b[2];
	h->flags = b[3];
	h->type = get16(b + 4);
	h->reserved = get16(b + 6);
	h->length = get32(b + 8);
	h->seq = get32(b + 12);
	return h->magic == ESPD_MAGIC && h->length >= ESPD_HDR_LEN &&
		   h->length <= ESPD_MAX_MSG && h->length % 4 == 0;
}

void espd_iter_init(espd_iter_t *it, const uint8_t *p, size_t len)
{
	it->p = p;
	it->left = len;
	it->bad = false;
}

bool espd_iter_next(espd_iter_t *it, espd_attr_t *a)
{
	size_t l, adv;

	if (it->bad || it->left == 0)
	{
		return false;
	}
	if (it->left < 4)
	{
		it->bad = true;
		return false;
	}
	l = get16(it->p);
	if (l < 4 || l > it->left)
	{
		it->bad = true;
		return false;
	}
	a->len = l - 4;
	a->type = get16(it->p + 2);
	a->val = it->p + 4;
	adv = (l + 3) & ~(size_t)3;
	if (adv > it->left)
	{
		/* the last attribute of a nested value may end unpadded */
		adv = it->left;
	}
	it->p += adv;
	it->left -= adv;
	return true;
}

void espd_iter_nested(espd_iter_t *it, const espd_attr_t *a)
{
	espd_iter_init(it, a->val, a->len);
}

bool espd_attr_u32(const espd_attr_t *a, uint32_t *v)
{
	if (a->len != 4)
	{
		return false;
	}
	*v = get32(a->val);
	return true;
}

bool espd_attr_u64(const espd_attr_t *a, uint64_t *v)
{
	if (a->len != 8)
	{
		return false;
	}
	*v = (uint64_t)get32(a->val) << 32 | get32(a->val + 4);
	return true;
}

bool espd_attr_pair(const espd_attr_t *a, uint16_t *x, uint16_t *y)
{
	if (a->len != 4)
	{
		return false;
	}
	*x = get16(a->val);
	*y = get16(a->val + 2);
	return true;
}

bool espd_attr_addr(const espd_attr_t *a, espd_addr_t *addr)
{
	if (a->len != 4 && a->len != 16)
	{
		return false;
	}
	addr->len = a->len;
	memcpy(addr->b, a->val, a->len);
	return true;
}

void espd_attr_str(const espd_attr_t *a, char *buf, size_t size)
{
	size_t n = a->len;

	if (size == 0)
	{
		return;
	}
	if (n > 0 && a->val[n - 1] == 0)
	{
		n--;
	}
	if (n >= size)
	{
		n = size - 1;
	}
	memcpy(buf, a->val, n);
	buf[n] = 0;
}

const char *espd_errno_name(uint32_t code)
{
	switch (code)
	{
		case 2:
			return "ENOENT";
		case 5:
			return "EIO";
		case 11:
			return "EAGAIN";
		case 13:
			return "EACCES";
		case 17:
			return "EEXIST";
		case 22:
			return "EINVAL";
		case 28:
			return "ENOSPC";
		case 71:
			return "EPROTO";
		case 74:
			return "EBADMSG";
		case 90:
			return "EMSGSIZE";
		case 93:
			return "EPROTONOSUPPORT";
		case 95:
			return "EOPNOTSUPP";
		case 110:
			return "ETIMEDOUT";
		case 114:
			return "EALREADY";
		default:
			return "error";
	}
}
