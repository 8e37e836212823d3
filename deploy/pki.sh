#!/usr/bin/env bash
# Makes a site PKI with openssl: a CA, then a certificate per site whose CN and
# subjectAltName DNS entry are the site name (that is what peers check), and
# the CA's certificate revocation list.
#   deploy/pki.sh DIR SITE...         -> DIR/ca.pem DIR/ca.key DIR/SITE.pem DIR/SITE.key DIR/crl.pem
#   deploy/pki.sh revoke DIR SITE...  revokes each SITE's certificate and rewrites DIR/crl.pem
#   deploy/pki.sh crl DIR             rewrites DIR/crl.pem (e.g. before its next-update date)
# Idempotent: existing files are kept. LONGHAUL_PKI_DAYS sets the validity of
# new site certificates (default 825), LONGHAUL_PKI_CRL_DAYS the next-update
# date of the CRL (default 365; daemons keep applying an overdue CRL and warn).
#
# A revoked certificate and its key move to DIR/revoked/SITE.SERIAL.{pem,key},
# so that `deploy/pki.sh DIR SITE` issues the site a new key and certificate.
# The CA's database (which serials are revoked, the CRL number) is kept in
# DIR/ca-db. Daemons read tls.crl again on SIGHUP (deploy/CONFIG.md).
set -euo pipefail

usage() {
  echo "usage: $0 DIR SITE... | $0 revoke DIR SITE... | $0 crl DIR" >&2
  exit 2
}

# The CA database and the openssl config of `openssl ca`, made on first use.
ca_config() {
  local dir=$1 db=$1/ca-db
  mkdir -p "$db"
  [ -f "$db/index.txt" ] || : >"$db/index.txt"
  [ -f "$db/crlnumber" ] || echo 01 >"$db/crlnumber"
  cat >"$db/openssl.cnf" <<EOF
[ ca ]
default_ca = longhaul_ca
[ longhaul_ca ]
database = $db/index.txt
crlnumber = $db/crlnumber
certificate = $dir/ca.pem
private_key = $dir/ca.key
default_md = sha256
default_crl_days = ${LONGHAUL_PKI_CRL_DAYS:-365}
unique_subject = no
EOF
  echo "$db/openssl.cnf"
}

gencrl() {
  local dir=$1 config
  config=$(ca_config "$dir")
  openssl ca -batch -config "$config" -gencrl -out "$dir/crl.pem.tmp" 2>"$dir/ca-db/last.log" || {
    cat "$dir/ca-db/last.log" >&2
    rm -f "$dir/crl.pem.tmp"
    return 1
  }
  chmod 0644 "$dir/crl.pem.tmp"
  mv "$dir/crl.pem.tmp" "$dir/crl.pem"
}

revoke() {
  local dir=$1 site=$2 config serial
  config=$(ca_config "$dir")
  if [ ! -f "$dir/$site.pem" ]; then
    if compgen -G "$dir/revoked/$site.*.pem" >/dev/null; then
      echo "pki: $site was revoked already and has no new certificate" >&2
      return 0
    fi
    echo "pki: $dir/$site.pem does not exist" >&2
    return 1
  fi
  serial=$(openssl x509 -in "$dir/$site.pem" -noout -serial | cut -d= -f2)
  if ! openssl ca -batch -config "$config" -revoke "$dir/$site.pem" -crl_reason keyCompromise \
    2>"$dir/ca-db/last.log"; then
    # Revoked already (an earlier run stopped before moving the files): carry on.
    if ! grep -q "Already revoked" "$dir/ca-db/last.log"; then
      cat "$dir/ca-db/last.log" >&2
      return 1
    fi
  fi
  mkdir -p "$dir/revoked"
  mv "$dir/$site.pem" "$dir/revoked/$site.$serial.pem"
  [ -f "$dir/$site.key" ] && mv "$dir/$site.key" "$dir/revoked/$site.$serial.key"
  echo "pki: revoked $site (serial $serial)" >&2
}

[ $# -ge 1 ] || usage
case $1 in
  revoke)
    [ $# -ge 3 ] || usage
    dir=$2
    shift 2
    [ -f "$dir/ca.key" ] || { echo "pki: $dir/ca.key not found" >&2; exit 1; }
    umask 077
    for site in "$@"; do revoke "$dir" "$site"; done
    gencrl "$dir"
    echo "pki: wrote $dir/crl.pem; send it to every site and SIGHUP their daemons" >&2
    exit 0
    ;;
  crl)
    [ $# -eq 2 ] || usage
    [ -f "$2/ca.key" ] || { echo "pki: $2/ca.key not found" >&2; exit 1; }
    umask 077
    gencrl "$2"
    exit 0
    ;;
esac

[ $# -ge 2 ] || usage
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
if [ ! -f "$dir/crl.pem" ] && [ -f "$dir/ca.key" ]; then
  gencrl "$dir"
fi
chmod 0644 "$dir"/*.pem
