/*
 * http_front.c - the listener-fed libmicrohttpd front shared by orch serve
 * and orch route. See http_front.h.
 */
#include "orchestrator/serve/http_front.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/util.h"

int http_front_admit(void *front, int fd, const struct sockaddr_in *peer) {
    http_front *f = front;
    return MHD_add_connection(f->d, fd, (const struct sockaddr *)peer, sizeof *peer) ==
                   MHD_YES
               ? 0
               : -1;
}

void http_front_on_connection(void *front, struct MHD_Connection *conn,
                              void **socket_context,
                              enum MHD_ConnectionNotificationCode toe) {
    http_front *f = front;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        http_front_conn *c = ci ? util_calloc(1, sizeof *c) : NULL;
        if (c) {
            c->fd = ci->connect_fd;
            c->cc = conn_watch_add(f->watch, c->fd);
            listener_conn_started(f->lst, c->fd);
        }
        *socket_context = c;
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        http_front_conn *c = *socket_context;
        if (c) {
            listener_conn_closed(f->lst, c->fd); /* before MHD closes the socket */
            conn_watch_remove(f->watch, c->cc);
            free(c);
        }
        *socket_context = NULL;
    }
}

int http_front_addr(const char *host, uint16_t port, struct sockaddr_in *out, char *err,
                    size_t err_cap) {
    memset(out, 0, sizeof *out);
    out->sin_family = AF_INET;
    out->sin_port = htons(port);
    if (!host) host = "127.0.0.1";
    if (inet_pton(AF_INET, host, &out->sin_addr) != 1) {
        util_set_err(err, err_cap, "--host '%s' is not an IPv4 address", host);
        return -1;
    }
    return 0;
}

unsigned http_front_inactivity(unsigned idle_s, unsigned header_s, unsigned body_s) {
    unsigned t = idle_s;
    if (header_s > t) t = header_s;
    if (body_s > t) t = body_s;
    return t;
}
