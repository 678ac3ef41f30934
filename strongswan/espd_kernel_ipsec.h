/*
 * Copyright (C) 2025 The espd authors
 *
 * This program is free software; you can redistribute it and/or modify it
 * under the terms of the GNU General Public License as published by the
 * Free Software Foundation; either version 2 of the License, or (at your
 * option) any later version.  See COPYING.
 */

/**
 * @defgroup espd_kernel_ipsec espd_kernel_ipsec
 * @{ @ingroup espd
 */
#ifndef ESPD_KERNEL_IPSEC_H_
#define ESPD_KERNEL_IPSEC_H_

#include <kernel/kernel_ipsec.h>

typedef struct espd_kernel_ipsec_t espd_kernel_ipsec_t;

/**
 * charon's IPsec backend over espd's control socket.
 *
 * It keeps no keys. It remembers which SAs it installed (SPI, addresses,
 * reqid) and the policies charon asked for, reference-counted, so that
 * when espd restarts it can reinstall the policies and make charon replace
 * the SAs that died with the old daemon (a hard expire each: charon deletes
 * the CHILD_SA and creates a new one with fresh keys).
 */
struct espd_kernel_ipsec_t {

	/**
	 * Implements kernel_ipsec_t interface
	 */
	kernel_ipsec_t interface;

	/**
	 * Compare what was installed with what espd has (after a reconnect or
	 * lost events): reinstall missing policies, fire a hard expire for
	 * every SA espd no longer has and a soft expire for soft-expired ones.
	 * Called by the event thread.
	 */
	void (*reconcile)(espd_kernel_ipsec_t *this);

	/**
	 * Forget an SA espd removed by itself (hard expire).
	 */
	void (*forget_sa)(espd_kernel_ipsec_t *this, uint32_t spi, host_t *dst);
};

/**
 * Create the backend; starts the event thread.
 *
 * @return			kernel_ipsec_t instance
 */
espd_kernel_ipsec_t *espd_kernel_ipsec_create();

#endif /** ESPD_KERNEL_IPSEC_H_ @}*/
