#!/bin/sh
# As the upstream redis image's entry point: options alone (or a .conf file) run
# redis-server; redis-server runs as user redis, owning the data in the working
# directory; files are private to it.
set -e

case "$1" in
  -*|*.conf) set -- redis-server "$@" ;;
esac

if [ "$1" = "redis-server" ]; then
  shift
  # protected mode off first, so that the command's own options still override it
  if [ "${1%.conf}" != "${1:-}" ]; then
    config="$1"
    shift
    set -- redis-server "$config" --protected-mode no "$@"
  else
    set -- redis-server --protected-mode no "$@"
  fi
  if [ "$(id -u)" = "0" ]; then
    find . \! -user redis -exec chown redis '{}' +
    exec setpriv --reuid=redis --regid=redis --init-groups "$0" "$@"
  fi
fi

if [ "$(umask)" = "0022" ]; then
  umask 0077
fi
exec "$@"
