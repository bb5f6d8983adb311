#!/bin/sh
# Credentials and certificates of the compose deployment (deploy/compose.yaml's `init` service), made
# once into volumes and kept on later runs: `roundhouse auth init` keeps every existing key and adds
# what is missing; the CA and the broker's certificate are made only if absent.
#
#   AUTH_DIR   the credentials directory (identities.json, auth.conf, <role>/<name>.creds)
#   PKI_DIR    ca/ (the CA and its key: only this script reads them), server/ (the broker's
#              certificate, key and ca.crt: mounted into the nats container only), trust/ (ca.crt:
#              mounted into every Roundhouse container)
#   NODES_DIR  <node>/<node>.creds: each worker container mounts only its own node's folder
#   BROKER_DIR auth.conf only (refreshed on every run): what the brokers mount as their auth/, so no
#              broker container holds a creds file
#   DB_DIR     postgres-password (read by the postgres container's entrypoint) and pgpass (the
#              scheduler's PGPASSFILE: its ROUNDHOUSE_DB URL names no password), made once
#   NAMESPACE, USERS, NODES, TLS_NAMES (the brokers' DNS names, all in one certificate that the
#              three servers share; the first is its CN)
#
# For a real deployment use your own CA and deploy/README.md "Security"; this CA exists for one
# compose project and its key sits in a volume.
set -eu

AUTH_DIR=${AUTH_DIR:-/etc/roundhouse/auth}
PKI_DIR=${PKI_DIR:-/etc/roundhouse/pki}
NODES_DIR=${NODES_DIR:-/etc/roundhouse/nodes}
BROKER_DIR=${BROKER_DIR:-/etc/roundhouse/broker}
DB_DIR=${DB_DIR:-/etc/roundhouse/db}
DB_HOST=${DB_HOST:-postgres}
DB_USER=${DB_USER:-roundhouse}
DB_NAME=${DB_NAME:-roundhouse}
NAMESPACE=${NAMESPACE:-prod}
USERS=${USERS:-alice}
NODES=${NODES:-node-0 node-1}
TLS_NAMES=${TLS_NAMES:-nats localhost}
umask 077

# --- identities -------------------------------------------------------------------------------------
set -- --dir "$AUTH_DIR" --namespace "$NAMESPACE"
for user in $USERS; do set -- "$@" --user "$user"; done
for node in $NODES; do set -- "$@" --node "$node"; done
roundhouse auth init "$@"
for node in $NODES; do
    mkdir -p "$NODES_DIR/$node"
    # Refreshed on every run, so a re-issued key reaches the worker at its next start.
    cp "$AUTH_DIR/worker/$node.creds" "$NODES_DIR/$node/$node.creds"
    chmod 0600 "$NODES_DIR/$node/$node.creds"
done

mkdir -p "$BROKER_DIR"
cp "$AUTH_DIR/auth.conf" "$BROKER_DIR/auth.conf.new"
chmod 0600 "$BROKER_DIR/auth.conf.new"
mv "$BROKER_DIR/auth.conf.new" "$BROKER_DIR/auth.conf"

# --- TLS --------------------------------------------------------------------------------------------
if [ ! -s "$PKI_DIR/server/server.crt" ]; then
    mkdir -p "$PKI_DIR/ca" "$PKI_DIR/server" "$PKI_DIR/trust"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -keyout "$PKI_DIR/ca/ca.key" -out "$PKI_DIR/ca/ca.crt" -days 825 \
        -subj "/CN=Roundhouse compose CA" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    set -- $TLS_NAMES
    cn=$1
    sans="IP:127.0.0.1"
    for name in "$@"; do sans="DNS:$name,$sans"; done
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -keyout "$PKI_DIR/server/server.key" -out "$work/server.csr" -subj "/CN=$cn" 2>/dev/null
    printf '%s\n' "subjectAltName = $sans" "basicConstraints = critical, CA:FALSE" \
        "keyUsage = critical, digitalSignature" "extendedKeyUsage = serverAuth, clientAuth" \
        "subjectKeyIdentifier = hash" "authorityKeyIdentifier = keyid, issuer" > "$work/server.ext"
    openssl x509 -req -in "$work/server.csr" -CA "$PKI_DIR/ca/ca.crt" -CAkey "$PKI_DIR/ca/ca.key" \
        -CAcreateserial -CAserial "$work/ca.srl" -out "$PKI_DIR/server/server.crt" -days 825 \
        -extfile "$work/server.ext" 2>/dev/null
    cp "$PKI_DIR/ca/ca.crt" "$PKI_DIR/server/ca.crt"
    cp "$PKI_DIR/ca/ca.crt" "$PKI_DIR/trust/ca.crt"
    # Certificates are public; the keys stay 0600.
    chmod 0644 "$PKI_DIR/ca/ca.crt" "$PKI_DIR/server/server.crt" "$PKI_DIR/server/ca.crt" "$PKI_DIR/trust/ca.crt"
    chmod 0755 "$PKI_DIR/trust"
fi
# --- PostgreSQL password ----------------------------------------------------------------------------
if [ ! -s "$DB_DIR/postgres-password" ]; then
    mkdir -p "$DB_DIR"
    password=$(openssl rand -hex 24)
    printf '%s' "$password" > "$DB_DIR/postgres-password"
    printf '%s:5432:%s:%s:%s\n' "$DB_HOST" "$DB_NAME" "$DB_USER" "$password" > "$DB_DIR/pgpass"
    chmod 0600 "$DB_DIR/postgres-password" "$DB_DIR/pgpass"
fi
echo "compose-init: credentials in $AUTH_DIR, certificates in $PKI_DIR"
