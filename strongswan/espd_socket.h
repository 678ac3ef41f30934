/*
 * Copyright (C) 2025 The espd authors
 *
 * This program is free software; you can redistribute it and/or modify it
 * under the terms of the GNU General Public License as published by the
 * Free Software Foundation; either version 2 of the License, or (at your
 * option) any later version.  See COPYING.
 */

/**
 * @defgroup espd_socket espd_socket
 * @{ @ingroup espd
 */
#ifndef ESPD_SOCKET_H_
#define ESPD_SOCKET_H_

#include <network/socket.h>

/**
 * charon's socket_t over espd's IKE hand-off (control protocol section 9).
 *
 * espd owns UDP ports 500 and 4500: it keeps ESP-in-UDP for itself and
 * forwards IKE datagrams (everything on 500, non-ESP-marked ones on 4500)
 * as IKE_PACKET messages on a connection where this socket registered with
 * IKE_REGISTER; charon's outgoing datagrams go back the same way and espd
 * sends them from its own sockets. Payloads travel as on the wire: on the
 * NAT-T port with the non-ESP marker, which charon's receiver strips and
 * its sender adds.
 *
 * @return			socket_t instance
 */
socket_t *espd_socket_create();

#endif /** ESPD_SOCKET_H_ @}*/
