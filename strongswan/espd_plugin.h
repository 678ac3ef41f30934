/*
 * Copyright (C) 2025 The espd authors
 *
 * This program is free software; you can redistribute it and/or modify it
 * under the terms of the GNU General Public License as published by the
 * Free Software Foundation; either version 2 of the License, or (at your
 * option) any later version.  See COPYING.
 */

/**
 * @defgroup espd espd
 * @ingroup cplugins
 *
 * charon plugin that installs IPsec SAs and policies into espd, a userspace
 * ESP data plane, over its control socket, and optionally takes IKE packets
 * from espd, which then owns UDP ports 500 and 4500 (IKE hand-off).
 *
 * @{
 */
#ifndef ESPD_PLUGIN_H_
#define ESPD_PLUGIN_H_

#include <plugins/plugin.h>

typedef struct espd_plugin_t espd_plugin_t;

/**
 * The espd plugin.
 */
struct espd_plugin_t {

	/**
	 * implements plugin interface
	 */
	plugin_t plugin;
};

/**
 * Settings of the plugin (charon.plugins.espd.*), read when it is created.
 */
typedef struct {
	/** control socket path (socket) */
	char *socket;
	/** bound for each exchange with espd, ms (timeout) */
	int timeout_ms;
	/** espd's --mark, set with SO_MARK on charon's IKE sockets (mark) */
	uint32_t mark;
	/** espd owns UDP 500/4500 and hands IKE packets over (ike_handoff) */
	bool ike_handoff;
} espd_settings_t;

/**
 * The plugin's settings.
 */
extern espd_settings_t espd_settings;

#endif /** ESPD_PLUGIN_H_ @}*/
