/*
 * Copyright (C) 2025 The espd authors
 * SPDX-License-Identifier: GPL-2.0-or-later
 *
 * Cross-check of the plugin's C codec (../../espd_msg.c) against the Go
 * control package: "build" writes messages the plugin sends, as one hex
 * line each; "parse" reads hex lines of messages espd sends and prints the
 * attributes the C parser finds, one "path type len hex" line each.
 */
#include "../../espd_msg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void hexout(const uint8_t *b, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
	{
		printf("%02x", b[i]);
	}
	printf("\n");
}

static int build(void)
{
	espd_addr_t src = { 4, { 198, 18, 0, 1 } }, dst = { 4, { 198, 18, 0, 2 } };
	espd_addr_t net6 = { 16, { 0x20, 0x01, 0x0d, 0xb8, 0, 1 } };
	espd_addr_t net6b = { 16, { 0x20, 0x01, 0x0d, 0xb8, 0, 2 } };
	uint8_t key[20], ike[33] = { 0 };
	espd_msg_t m;
	int i;

	for (i = 0; i < 20; i++)
	{
		key[i] = i + 1;
	}
	/* SA_ADD as add_sa builds it */
	espd_msg_init(&m, ESPD_MSG_SA_ADD, 0x01020304);
	espd_msg_u32(&m, ESPD_A_SPI, 0xc1234567);
	espd_msg_addr(&m, ESPD_A_SRC, &src);
	espd_msg_addr(&m, ESPD_A_DST, &dst);
	espd_msg_u32(&m, ESPD_A_DIR, ESPD_DIR_OUT);
	espd_msg_u32(&m, ESPD_A_PROTO, 50);
	espd_msg_u32(&m, ESPD_A_MODE, ESPD_MODE_TUNNEL);
	espd_msg_u32(&m, ESPD_A_REQID, 7);
	espd_msg_u32(&m, ESPD_A_ENC_ALG, 20);
	espd_msg_u32(&m, ESPD_A_ENC_KEYLEN, 128);
	espd_msg_put(&m, ESPD_A_ENC_KEY, key, 20);
	espd_msg_u32(&m, ESPD_A_ESN, 1);
	espd_msg_pair(&m, ESPD_A_ENCAP, 4500, 4501);
	espd_msg_u32(&m, ESPD_A_IF_ID, 42);
	espd_msg_begin(&m, ESPD_A_SELECTOR);
	espd_msg_prefix(&m, ESPD_SEL_SRC, &net6, 48);
	espd_msg_prefix(&m, ESPD_SEL_DST, &net6b, 64);
	espd_msg_u32(&m, ESPD_SEL_PROTO, 6);
	espd_msg_pair(&m, ESPD_SEL_DST_PORTS, 443, 443);
	espd_msg_end(&m);
	espd_msg_begin(&m, ESPD_A_LIFETIME_HARD);
	espd_msg_u64(&m, ESPD_LT_BYTES, 0x100000000ULL);
	espd_msg_u64(&m, ESPD_LT_ADD_TIME, 3600000000000ULL);
	espd_msg_end(&m);
	if (!espd_msg_finish(&m))
	{
		return 1;
	}
	hexout(m.buf, m.len);
	espd_msg_free(&m);

	/* IKE_PACKET as the socket sends it: odd-sized payload (padding) */
	ike[4] = 0x11;
	espd_msg_init(&m, ESPD_MSG_IKE_PACKET, 9);
	espd_msg_addr(&m, ESPD_A_SRC, &src);
	espd_msg_addr(&m, ESPD_A_DST, &dst);
	espd_msg_pair(&m, ESPD_A_IKE_PORTS, 4500, 4500);
	espd_msg_put(&m, ESPD_A_IKE_DATA, ike, sizeof(ike));
	if (!espd_msg_finish(&m))
	{
		return 1;
	}
	hexout(m.buf, m.len);
	espd_msg_free(&m);

	/* a nesting too deep and an oversized message must fail */
	espd_msg_init(&m, ESPD_MSG_SA_ADD, 1);
	for (i = 0; i < 5; i++)
	{
		espd_msg_begin(&m, ESPD_A_SELECTOR);
	}
	printf("deep %d\n", espd_msg_finish(&m));
	espd_msg_free(&m);
	espd_msg_init(&m, ESPD_MSG_SA_ADD, 1);
	for (i = 0; i < 2000; i++)
	{
		espd_msg_put(&m, ESPD_A_ENC_KEY, ike, sizeof(ike));
	}
	printf("big %d\n", espd_msg_finish(&m));
	espd_msg_free(&m);
	return 0;
}

static void walk(const uint8_t *p, size_t len, const char *path, int depth)
{
	espd_iter_t it;
	espd_attr_t a;
	char sub[64];

	espd_iter_init(&it, p, len);
	while (espd_iter_next(&it, &a))
	{
		printf("%s %u %u ", path, a.type, a.len);
		hexout(a.val, a.len);
		/* the nested attributes of SA_GET/EVENT replies */
		if (depth == 0 && (a.type == ESPD_A_SA_STATS || a.type == ESPD_A_FLOW ||
						   a.type == ESPD_A_SELECTOR))
		{
			snprintf(sub, sizeof(sub), "%s/%u", path, a.type);
			walk(a.val, a.len, sub, 1);
		}
	}
	if (it.bad)
	{
		printf("%s bad\n", path);
	}
}

static int parse(void)
{
	static uint8_t buf[ESPD_MAX_MSG];
	char line[2 * ESPD_MAX_MSG + 2];
	espd_hdr_t h;
	size_t n, i;
	unsigned v;

	while (fgets(line, sizeof(line), stdin))
	{
		n = strcspn(line, "\n") / 2;
		for (i = 0; i < n; i++)
		{
			sscanf(line + 2 * i, "%2x", &v);
			buf[i] = v;
		}
		if (n < ESPD_HDR_LEN || !espd_hdr_parse(buf, &h) || h.length != n)
		{
			printf("header bad\n");
			continue;
		}
		printf("msg %u %u %u\n", h.type, h.flags, h.seq);
		walk(buf + ESPD_HDR_LEN, n - ESPD_HDR_LEN, "top", 0);
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 2 && strcmp(argv[1], "build") == 0)
	{
		return build();
	}
	if (argc == 2 && strcmp(argv[1], "parse") == 0)
	{
		return parse();
	}
	fprintf(stderr, "usage: codec build|parse\n");
	return 2;
}
