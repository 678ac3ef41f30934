/*
 * Copyright (C) 2025 The espd authors
 *
 * This program is free software; you can redistribute it and/or modify it
 * under the terms of the GNU General Public License as published by the
 * Free Software Foundation; either version 2 of the License, or (at your
 * option) any later version.  See COPYING.
 */

#include "espd_plugin.h"
#include "espd_conn.h"
#include "espd_kernel_ipsec.h"
#include "espd_socket.h"

#include <daemon.h>

espd_settings_t espd_settings;

typedef struct private_espd_plugin_t private_espd_plugin_t;

/**
 * Private data.
 */
struct private_espd_plugin_t {

	/**
	 * Public interface
	 */
	espd_plugin_t public;
};

METHOD(plugin_t, get_name, char*,
	private_espd_plugin_t *this)
{
	return "espd";
}

METHOD(plugin_t, get_features, int,
	private_espd_plugin_t *this, plugin_feature_t *features[])
{
	static plugin_feature_t with_socket[] = {
		PLUGIN_CALLBACK(kernel_ipsec_register, espd_kernel_ipsec_create),
			PLUGIN_PROVIDE(CUSTOM, "kernel-ipsec"),
		PLUGIN_CALLBACK(socket_register, espd_socket_create),
			PLUGIN_PROVIDE(CUSTOM, "socket"),
				PLUGIN_DEPENDS(CUSTOM, "kernel-ipsec"),
	};
	static plugin_feature_t without_socket[] = {
		PLUGIN_CALLBACK(kernel_ipsec_register, espd_kernel_ipsec_create),
			PLUGIN_PROVIDE(CUSTOM, "kernel-ipsec"),
	};

	if (espd_settings.ike_handoff)
	{
		*features = with_socket;
		return countof(with_socket);
	}
	*features = without_socket;
	return countof(without_socket);
}

METHOD(plugin_t, destroy, void,
	private_espd_plugin_t *this)
{
	free(espd_settings.socket);
	espd_settings.socket = NULL;
	free(this);
}

/**
 * Make kernel-netlink's own route lookups skip espd's routing table.
 *
 * espd routes the remote traffic selectors into its TUN from a table that
 * every packet without espd's mark consults first. A remote subnet that
 * covers the peer's IKE address (or the local one) then makes charon's
 * route lookups for IKE answer "through the TUN": no source address, MOBIKE
 * moving the IKE_SA to another address family and back. kernel-netlink's
 * fwmark option, inverted, marks its route lookups with espd's mark (which
 * espd's rule excludes) and gives its own table's rule the same exclusion.
 * Plugin constructors run before any plugin feature is loaded, so the
 * default set here is in place when kernel-netlink reads it; an explicit
 * setting wins.
 */
static void exclude_espd_routes(void)
{
	char want[16], *have;

	snprintf(want, sizeof(want), "!0x%x", espd_settings.mark);
	if (lib->settings->set_default_str(lib->settings,
						"%s.plugins.kernel-netlink.fwmark", want, lib->ns))
	{
		DBG1(DBG_KNL, "espd: charon's route lookups skip espd's routes "
			 "(kernel-netlink fwmark = %s)", want);
		return;
	}
	have = lib->settings->get_str(lib->settings,
						"%s.plugins.kernel-netlink.fwmark", "", lib->ns);
	if (!streq(have, want))
	{
		DBG1(DBG_KNL, "espd: kernel-netlink's fwmark is %s, not %s: charon's "
			 "route lookups may go through espd's TUN (no address found, "
			 "MOBIKE flapping) if a remote subnet covers an IKE address",
			 have, want);
	}
}

/*
 * Described in header.
 */
plugin_t *espd_plugin_create()
{
	private_espd_plugin_t *this;
	char *socket;

	socket = lib->settings->get_str(lib->settings, "%s.plugins.espd.socket",
									ESPD_DEFAULT_SOCKET, lib->ns);
	if (strpfx(socket, "unix://"))
	{
		socket += strlen("unix://");
	}
	espd_settings = (espd_settings_t){
		.socket = strdup(socket),
		.timeout_ms = lib->settings->get_int(lib->settings,
							"%s.plugins.espd.timeout", 5000, lib->ns),
		.mark = lib->settings->get_int(lib->settings, "%s.plugins.espd.mark",
									   0xe5d0, lib->ns),
		.ike_handoff = lib->settings->get_bool(lib->settings,
							"%s.plugins.espd.ike_handoff", FALSE, lib->ns),
	};
	if (espd_settings.timeout_ms < 100)
	{
		espd_settings.timeout_ms = 100;
	}
	exclude_espd_routes();
	DBG1(DBG_KNL, "espd: plugin built for strongSwan %s; ESP goes through "
		 "espd at %s (IKE hand-off %s, mark 0x%x)", VERSION,
		 espd_settings.socket, espd_settings.ike_handoff ? "on" : "off",
		 espd_settings.mark);

	INIT(this,
		.public = {
			.plugin = {
				.get_name = _get_name,
				.get_features = _get_features,
				.destroy = _destroy,
			},
		},
	);
	return &this->public.plugin;
}
