/*
 * Copyright (C) 2025 The espd authors
 *
 * This program is free software; you can redistribute it and/or modify it
 * under the terms of the GNU General Public License as published by the
 * Free Software Foundation; either version 2 of the License, or (at your
 * option) any later version.  See COPYING.
 */

/**
 * Conversions between charon's host_t and the protocol's addresses.
 */
#ifndef ESPD_HOST_H_
#define ESPD_HOST_H_

#include "espd_msg.h"

#include <networking/host.h>

/**
 * Copy a host's address (4 or 16 bytes) into a; FALSE for no host or
 * another length.
 */
bool espd_host2addr(host_t *h, espd_addr_t *a);

/**
 * A new host of a's address and port; NULL if a is neither 4 nor 16
 * bytes long (absent).
 */
host_t *espd_addr2host(const espd_addr_t *a, uint16_t port);

#endif /** ESPD_HOST_H_ */
