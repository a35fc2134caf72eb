/* Preloaded (LD_PRELOAD) beside mptcpize's libmptcpwrap so gloo runs over kernel MPTCP.
 *
 * gloo sets SO_REUSEADDR on every socket it holds, also on sockets returned by accept()
 * (gloo/transport/tcp/socket.cc). On an accepted MPTCP socket the kernel of our lab machines
 * rejects that option with EINVAL, and gloo aborts the process on the error. The option means
 * nothing for an accepted connection, so this wrapper reports success for exactly that case:
 * SO_REUSEADDR, EINVAL, and a socket whose protocol is MPTCP. Every other call and error
 * passes through unchanged.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stddef.h>
#include <sys/socket.h>

#ifndef IPPROTO_MPTCP
#define IPPROTO_MPTCP 262
#endif

typedef int (*setsockopt_fn)(int, int, int, const void *, socklen_t);

static int is_mptcp(int fd) {
  int proto = 0;
  socklen_t len = sizeof proto;
  return getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &len) == 0 && proto == IPPROTO_MPTCP;
}

int setsockopt(int fd, int level, int name, const void *value, socklen_t len) {
  static setsockopt_fn next;
  if (next == NULL) next = (setsockopt_fn)dlsym(RTLD_NEXT, "setsockopt");
  int rc = next(fd, level, name, value, len);
  if (rc == -1 && errno == EINVAL && level == SOL_SOCKET && name == SO_REUSEADDR && is_mptcp(fd)) {
    errno = 0;
    return 0;
  }
  return rc;
}
