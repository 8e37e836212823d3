#!/usr/bin/env bash
# Makes a site PKI with openssl: a CA, then a certificate per site whose CN and
# subjectAltName DNS entry are the site name (that is what peers check).
#   deploy/pki.sh DIR SITE...      -> DIR/ca.pem DIR/ca.key DIR/SITE.pem DIR/SITE.key
# Idempotent: existing files are kept. LONGHAUL_PKI_DAYS sets the validity of
# new site certificates (default 825).
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 DIR SITE..." >&2
  exit 2
fi
dir=$1
shift
days=${LONGHAUL_PKI_DAYS:-825}
mkdir -p "$dir"
umask 077
if [ ! -f "$dir/ca.pem" ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$dir/ca.key" -out "$dir/ca.pem" -days 3650 -subj "/CN=longhaul-ca" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    2>/dev/null
fi
for site in "$@"; do
  [ -f "$dir/$site.pem" ] && continue
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$dir/$site.key" -out "$dir/$site.csr" -subj "/CN=$site" 2>/dev/null
  ext=$(mktemp)
  printf 'subjectAltName=DNS:%s\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n' "$site" >"$ext"
  openssl x509 -req -in "$dir/$site.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -CAcreateserial \
    -days "$days" -out "$dir/$site.pem" -extfile "$ext" 2>/dev/null
  rm -f "$ext" "$dir/$site.csr"
done
chmod 0644 "$dir"/*.pem
