/*
 * Copyright (C) 2025 The espd authors
 *
 * This program is free software; you can redistribute it and/or modify it
 * under the terms of the GNU General Public License as published by the
 * Free Software Foundation; either version 2 of the License, or (at your
 * option) any later version.  See COPYING.
 */

/**
 * @defgroup espd_events espd_events
 * @{ @ingroup espd
 */
#ifndef ESPD_EVENTS_H_
#define ESPD_EVENTS_H_

#include "espd_kernel_ipsec.h"

typedef struct espd_events_t espd_events_t;

/**
 * A thread with its own connection to espd, subscribed to its events: soft
 * and hard expires, acquires and NAT mapping changes become charon's
 * kernel events. It reconnects when espd restarts (and then has the
 * backend reconcile what charon installed with what espd has), and tells
 * charon's log why it is not connected.
 */
struct espd_events_t {

	/**
	 * Stop the thread and free.
	 */
	void (*destroy)(espd_events_t *this);
};

/**
 * Start the event thread.
 *
 * @param ipsec		backend to reconcile after reconnects
 */
espd_events_t *espd_events_create(espd_kernel_ipsec_t *ipsec);

#endif /** ESPD_EVENTS_H_ @}*/
