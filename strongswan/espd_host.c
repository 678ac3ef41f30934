/*
 * Copyright (C) 2025 The espd authors
 *
 * This program is free software; you can redistribute it and/or modify it
 * under the terms of the GNU General Public License as published by the
 * Free Software Foundation; either version 2 of the License, or (at your
 * option) any later version.  See COPYING.
 */

#include "espd_host.h"

#include <sys/socket.h>
#include <string.h>

bool espd_host2addr(host_t *h, espd_addr_t *a)
{
	chunk_t c;

	if (!h)
	{
		return FALSE;
	}
	c = h->get_address(h);
	if (c.len != 4 && c.len != 16)
	{
		return FALSE;
	}
	a->len = c.len;
	memcpy(a->b, c.ptr, c.len);
	return TRUE;
}

host_t *espd_addr2host(const espd_addr_t *a, uint16_t port)
{
	switch (a->len)
	{
		case 4:
			return host_create_from_chunk(AF_INET,
									chunk_create((u_char*)a->b, 4), port);
		case 16:
			return host_create_from_chunk(AF_INET6,
									chunk_create((u_char*)a->b, 16), port);
		default:
			return NULL;
	}
}
