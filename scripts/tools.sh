# Sourced by scripts/run and scripts/test: installs what is missing, and only that, so both are
# safe to run twice. Needs the package registries (crates.io, npm, Debian), nothing else.
#
# Every step says what it does; a failed step ends the script with one line naming the step and
# why (the installer's own output stays above it). Each check is a plain `if`, never a command
# substitution that `set -euo pipefail` could kill when the tool is absent.
#
# scripts/tests/installer.sh runs install_tools with each tool absent in turn and the installers
# (apt-get, cargo, npm, rustup) replaced by stubs; these variables are its seams:
#   CHECKOUT_ROOT     the project (Cargo.lock, tools/package.json); default: this checkout
#   CHECKOUT_PG_BIN   where Debian keeps PostgreSQL's programs; default /usr/lib/postgresql/15/bin
#   CHECKOUT_PGBOUNCER  PgBouncer's program; default /usr/sbin/pgbouncer (Debian's)
#   CHECKOUT_RABBITMQ_BIN  RabbitMQ's programs; default /usr/lib/rabbitmq/bin (Debian's)
#   CHECKOUT_OPENSSL_PC  OpenSSL's pkg-config file (webauthn-rs links OpenSSL); default Debian's
#   CHECKOUT_PATRONI, CHECKOUT_ETCD, CHECKOUT_HAPROXY  the HA cluster's programs; default Debian's

CHECKOUT_ROOT="${CHECKOUT_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
CHECKOUT_PG_BIN="${CHECKOUT_PG_BIN:-/usr/lib/postgresql/15/bin}"
CHECKOUT_PGBOUNCER="${CHECKOUT_PGBOUNCER:-/usr/sbin/pgbouncer}"
CHECKOUT_RABBITMQ_BIN="${CHECKOUT_RABBITMQ_BIN:-/usr/lib/rabbitmq/bin}"
CHECKOUT_OPENSSL_PC="${CHECKOUT_OPENSSL_PC:-/usr/lib/x86_64-linux-gnu/pkgconfig/openssl.pc}"
CHECKOUT_PATRONI="${CHECKOUT_PATRONI:-/usr/bin/patroni}"
CHECKOUT_ETCD="${CHECKOUT_ETCD:-/usr/bin/etcd}"
CHECKOUT_HAPROXY="${CHECKOUT_HAPROXY:-/usr/sbin/haproxy}"
TRUNK_VERSION=0.21.14
BINARYEN_VERSION=132
AXE_CORE_VERSION=4.14.1
ESBUILD_VERSION=0.25.12
SCHEMATHESIS_VERSION=4.32.5
AIOSMTPD_VERSION=1.4.6

say() { printf '==> %s\n' "$*"; }

# One line on stderr, then exit: "<script>: <step> failed: <why>".
fail() {
    printf '%s: %s failed: %s\n' "$(basename "${0:-setup}")" "$1" "$2" >&2
    exit 1
}

# step "what it does" command…: says what it does, runs it, and on failure ends with one line.
step() {
    local what="$1"
    shift
    say "$what"
    local status=0
    "$@" || status=$?
    [ "$status" -eq 0 ] || fail "$what" "\`$*\` exited with status $status (its output is above)"
}

# The first line a command prints, or nothing when it is absent or fails.
version_of() {
    local out
    out=$("$@" 2>/dev/null) || return 0
    printf '%s\n' "${out%%$'\n'*}"
}

as_root() {
    if [ "$(id -u)" = 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        fail "installing Debian packages" "not root and no sudo to run: $*"
    fi
}

apt_install() {
    as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
}

# The wasm-bindgen version Cargo.lock pins (the CLI must be exactly it).
locked_wasm_bindgen() {
    awk '/^name = "wasm-bindgen"$/ { getline; gsub(/"/, "", $3); print $3; exit }' \
        "$CHECKOUT_ROOT/Cargo.lock"
}

has_postgres() {
    [ -x "$CHECKOUT_PG_BIN/initdb" ] && [ -x "$CHECKOUT_PG_BIN/pg_ctl" ] && return 0
    command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1
}

# The API suite also runs through PgBouncer (transaction pooling) in front of PostgreSQL.
has_pgbouncer() {
    [ -x "$CHECKOUT_PGBOUNCER" ]
}

# The tests start a throwaway RabbitMQ node (the checkout's events on a broker).
has_rabbitmq() {
    [ -x "$CHECKOUT_RABBITMQ_BIN/rabbitmq-server" ] && [ -x "$CHECKOUT_RABBITMQ_BIN/rabbitmqctl" ]
}

# The highly available PostgreSQL of the failover tests and scripts/cluster: Patroni (with its
# PostgreSQL driver and etcd client, which the package brings), etcd, HAProxy.
has_patroni() {
    [ -x "$CHECKOUT_PATRONI" ]
}

has_etcd() {
    [ -x "$CHECKOUT_ETCD" ]
}

has_haproxy() {
    [ -x "$CHECKOUT_HAPROXY" ]
}

# The server's passkeys (webauthn-rs) link OpenSSL: its headers, and pkg-config to find them.
has_openssl_dev() {
    [ -f "$CHECKOUT_OPENSSL_PC" ] && command -v pkg-config >/dev/null 2>&1
}

has_wasm_target() {
    local installed
    installed=$(rustup target list --installed 2>/dev/null) || return 1
    [[ $'\n'"$installed"$'\n' == *$'\nwasm32-unknown-unknown\n'* ]]
}

has_trunk() {
    [[ "$(version_of trunk --version)" == "trunk $TRUNK_VERSION" ]]
}

has_wasm_bindgen() {
    local want
    want=$(locked_wasm_bindgen)
    [ -n "$want" ] || fail "reading Cargo.lock" "no wasm-bindgen version in $CHECKOUT_ROOT/Cargo.lock"
    [[ "$(version_of wasm-bindgen --version)" == "wasm-bindgen $want" ]]
}

wasm_opt() { printf '%s\n' "$CHECKOUT_ROOT/tools/node_modules/.bin/wasm-opt"; }

has_wasm_opt() {
    [[ "$(version_of "$(wasm_opt)" --version)" == *"version $BINARYEN_VERSION"* ]]
}

# esbuild: minifies the JavaScript wasm-bindgen writes (a fifth of the frame's transfer).
esbuild() { printf '%s\n' "$CHECKOUT_ROOT/tools/node_modules/.bin/esbuild"; }

has_esbuild() {
    [[ "$(version_of "$(esbuild)" --version)" == "$ESBUILD_VERSION" ]]
}

# axe-core: the accessibility engine the browser tests run in the payment frame (a script,
# not a program: its package.json says which version is there).
axe_core_dir() { printf '%s\n' "$CHECKOUT_ROOT/tools/node_modules/axe-core"; }

has_axe_core() {
    [ -f "$(axe_core_dir)/axe.min.js" ] &&
        grep -q "\"version\": \"$AXE_CORE_VERSION\"" "$(axe_core_dir)/package.json"
}

schemathesis() { printf '%s\n' "$CHECKOUT_ROOT/tools/venv/bin/st"; }

has_schemathesis() {
    [[ "$(version_of "$(schemathesis)" --version)" == "st, version $SCHEMATHESIS_VERSION" ]]
}

install_schemathesis() {
    python3 -m venv "$CHECKOUT_ROOT/tools/venv" &&
        "$CHECKOUT_ROOT/tools/venv/bin/pip" install --quiet --disable-pip-version-check \
            "schemathesis==$SCHEMATHESIS_VERSION"
}

# aiosmtpd: the SMTP server the tests and scripts/run start, where the checkout's mail (a live
# shopper's codes) arrives; from PyPI into the same virtual environment.
aiosmtpd() { printf '%s\n' "$CHECKOUT_ROOT/tools/venv/bin/aiosmtpd"; }

has_aiosmtpd() {
    [[ "$(version_of "$(aiosmtpd)" --version)" == *" $AIOSMTPD_VERSION" ]]
}

install_aiosmtpd() {
    { [ -x "$CHECKOUT_ROOT/tools/venv/bin/pip" ] || python3 -m venv "$CHECKOUT_ROOT/tools/venv"; } &&
        "$CHECKOUT_ROOT/tools/venv/bin/pip" install --quiet --disable-pip-version-check \
            "aiosmtpd==$AIOSMTPD_VERSION"
}

# Fails the step when a tool that was just installed still cannot be found.
verify() {
    local what="$1" check="$2"
    "$check" || fail "$what" "it was installed, but \`$check\` still does not find it"
}

install_tools() {
    export PATH="$CHECKOUT_ROOT/tools/node_modules/.bin:${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"

    # Debian's packages, in one apt-get call.
    local debian=()
    command -v chromium >/dev/null 2>&1 || debian+=(chromium)
    command -v chromedriver >/dev/null 2>&1 || debian+=(chromium-driver)
    command -v npm >/dev/null 2>&1 || debian+=(npm)
    command -v python3 >/dev/null 2>&1 || debian+=(python3 python3-venv)
    has_postgres || debian+=(postgresql)
    has_pgbouncer || debian+=(pgbouncer)
    has_rabbitmq || debian+=(rabbitmq-server)
    has_patroni || debian+=(patroni)
    has_etcd || debian+=(etcd-server)
    has_haproxy || debian+=(haproxy)
    has_openssl_dev || debian+=(libssl-dev pkg-config)
    if [ ${#debian[@]} -gt 0 ]; then
        step "installing ${debian[*]} (Debian packages)" apt_install "${debian[@]}"
        command -v chromium >/dev/null 2>&1 || fail "installing chromium" "no chromium on PATH"
        command -v chromedriver >/dev/null 2>&1 || fail "installing chromium-driver" "no chromedriver on PATH"
        command -v npm >/dev/null 2>&1 || fail "installing npm" "no npm on PATH"
        verify "installing postgresql" has_postgres
        verify "installing pgbouncer" has_pgbouncer
        verify "installing rabbitmq-server" has_rabbitmq
        verify "installing patroni" has_patroni
        verify "installing etcd-server" has_etcd
        verify "installing haproxy" has_haproxy
        verify "installing libssl-dev and pkg-config" has_openssl_dev
    fi

    # The toolchain itself comes from rust-toolchain.toml; its wasm target may not.
    if ! has_wasm_target; then
        step "adding the Rust target wasm32-unknown-unknown" rustup target add wasm32-unknown-unknown
        verify "adding the Rust target wasm32-unknown-unknown" has_wasm_target
    fi

    # Trunk 0.22 needs a newer rustc than the pinned one.
    if ! has_trunk; then
        step "installing trunk $TRUNK_VERSION with cargo (6 to 11 minutes, once)" \
            cargo install trunk --version "$TRUNK_VERSION" --locked
        verify "installing trunk $TRUNK_VERSION" has_trunk
    fi

    # Trunk runs offline, so the wasm-bindgen CLI must be exactly the locked crate's version.
    if ! has_wasm_bindgen; then
        local want
        want=$(locked_wasm_bindgen)
        step "installing wasm-bindgen-cli $want with cargo (about 3 minutes, once)" \
            cargo install wasm-bindgen-cli --version "$want"
        verify "installing wasm-bindgen-cli $want" has_wasm_bindgen
    fi

    # wasm-opt: binaryen 132 from npm (Debian's 108 breaks wasm-bindgen's output); esbuild and
    # axe-core beside it. One locked `npm ci` brings all three.
    if ! has_wasm_opt || ! has_esbuild || ! has_axe_core; then
        step "installing binaryen $BINARYEN_VERSION (wasm-opt), esbuild $ESBUILD_VERSION and axe-core $AXE_CORE_VERSION from npm into tools/" \
            npm ci --prefix "$CHECKOUT_ROOT/tools" --no-audit --no-fund --silent
        verify "installing binaryen $BINARYEN_VERSION" has_wasm_opt
        verify "installing esbuild $ESBUILD_VERSION" has_esbuild
        verify "installing axe-core $AXE_CORE_VERSION" has_axe_core
    fi
    # Schemathesis (the schema-driven fuzz), from PyPI into a virtual environment of its own.
    if ! has_schemathesis; then
        step "installing schemathesis $SCHEMATHESIS_VERSION from PyPI into tools/venv" \
            install_schemathesis
        verify "installing schemathesis $SCHEMATHESIS_VERSION" has_schemathesis
    fi
    if ! has_aiosmtpd; then
        step "installing aiosmtpd $AIOSMTPD_VERSION (an SMTP server for the tests) from PyPI into tools/venv" \
            install_aiosmtpd
        verify "installing aiosmtpd $AIOSMTPD_VERSION" has_aiosmtpd
    fi
    say "tools ready: $(version_of trunk --version), $(version_of wasm-bindgen --version), $(version_of "$(wasm_opt)" --version), esbuild $ESBUILD_VERSION, axe-core $AXE_CORE_VERSION, $(version_of chromium --version), $(version_of "$(schemathesis)" --version), $(version_of "$(aiosmtpd)" --version)"
}

# The widget, release-built into dist/: smallest code (opt-level z, LTO, wasm-opt -Oz); then
# the account window (a binary of its own, served at /account) into dist/account/ (after the
# widget: Trunk empties its dist/ first).
build_widget() {
    # Source paths in panic locations, shortened to the crate's own (`leptos-0.8.23/src/…`,
    # `core/src/…`): bytes every shopper would download.
    local registry="${CARGO_HOME:-$HOME/.cargo}/registry/src" remaps dir
    remaps="--remap-path-prefix=$CHECKOUT_ROOT/="
    for dir in "$registry"/*/; do
        remaps+=" --remap-path-prefix=$dir="
    done
    local sysroot
    sysroot=$(rustc --print sysroot)
    remaps+=" --remap-path-prefix=$sysroot/lib/rustlib/src/rust/library/="
    remaps+=" --remap-path-prefix=/rustc/$(rustc -vV | sed -n 's/^commit-hash: //p')/library/="
    RUSTFLAGS="$remaps" \
        step "building the widget into dist/" \
        trunk build --offline --release --cargo-profile wasm-release --no-sri true
    RUSTFLAGS="$remaps" \
        step "building the account window into dist/account/" \
        trunk build --offline --release --cargo-profile wasm-release --no-sri true \
        --dist dist/account --public-url /account/ frontend/account.html
    # wasm-bindgen's JavaScript, minified in place (Trunk only minifies HTML and CSS): 6.9 KB
    # of the frame's transfer become 5.2. (Hence no SRI hashes: they would name the unminified.)
    local script
    for script in "$CHECKOUT_ROOT"/dist/checkout-*.js "$CHECKOUT_ROOT"/dist/account/checkout-*.js; do
        step "minifying $(basename "$script")" \
            "$(esbuild)" --minify --format=esm --log-level=warning "--outfile=$script" --allow-overwrite "$script"
    done
}
