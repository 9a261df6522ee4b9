#!/usr/bin/env bash
# The installer's own test: runs install_tools (scripts/tools.sh) under `set -euo pipefail` with
# a PATH where each tool in turn is absent and the real installers (apt-get, cargo, npm, rustup,
# python3's venv and its pip) are stubs that record what they were asked to install and then put
# a fake of it in place.
# Asserts that exactly the missing tool is installed and that the script exits 0; that a present
# tool is never reinstalled; that a failing installer ends with one line naming the step.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tools_sh="$here/../tools.sh"
lock_version=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/"/, "", $3); print $3; exit }' \
    "$here/../../Cargo.lock")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0
failed=0

# A fake executable that prints one line (its version) and, if asked, records its calls.
fake() {
    local path="$1" line="$2"
    mkdir -p "$(dirname "$path")"
    printf '#!/bin/bash\necho %q\n' "$line" >"$path"
    chmod +x "$path"
}

fake_trunk() { fake "$1/trunk" "trunk 0.21.14"; }
fake_wasm_bindgen() { fake "$1/wasm-bindgen" "wasm-bindgen $lock_version"; }
fake_wasm_opt() { fake "$1/wasm-opt" "wasm-opt version 132 (version_132)"; }
fake_esbuild() { fake "$1/esbuild" "0.25.12"; }
fake_chromium() { fake "$1/chromium" "Chromium 156.0.8078.73"; }
fake_chromedriver() { fake "$1/chromedriver" "ChromeDriver 156.0.8078.73"; }
fake_postgres() { fake "$1/initdb" "initdb (PostgreSQL) 15"; fake "$1/pg_ctl" "pg_ctl (PostgreSQL) 15"; }
fake_pgbouncer() { fake "$1/pgbouncer" "PgBouncer 1.18.0"; }
fake_rabbitmq() { fake "$1/rabbitmq-server" "RabbitMQ 3.10.8"; fake "$1/rabbitmqctl" "RabbitMQ 3.10.8"; }
fake_schemathesis() { fake "$1/st" "st, version 4.32.5"; }
fake_aiosmtpd() { fake "$1/aiosmtpd" "$1/aiosmtpd 1.4.6"; }
fake_patroni() { fake "$1/patroni" "patroni 3.0.2"; }
fake_etcd() { fake "$1/etcd" "etcd Version: 3.4.23"; }
fake_haproxy() { fake "$1/haproxy" "HAProxy version 2.6.12"; }
fake_openssl_dev() { mkdir -p "$1/pkgconfig"; : >"$1/pkgconfig/openssl.pc"; fake "$2/pkg-config" "1.8.1"; }
fake_axe_core() {
    mkdir -p "$1/axe-core"
    : >"$1/axe-core/axe.min.js"
    printf '{\n  "name": "axe-core",\n  "version": "4.14.1"\n}\n' >"$1/axe-core/package.json"
}

# A venv's pip stub: records what it installs and makes the fake of it.
make_pip() {
    local venv="$1"
    mkdir -p "$venv/bin"
    printf '%s\n' '#!/bin/bash' ". \"$dir/fakes.sh\"" "echo \"pip \$*\" >>\"$dir/installs\"" \
        "case \"\$*\" in" \
        "    *schemathesis==*) fake_schemathesis \"$venv/bin\" ;;" \
        "    *aiosmtpd==*) fake_aiosmtpd \"$venv/bin\" ;;" \
        "esac" >"$venv/bin/pip"
    chmod +x "$venv/bin/pip"
}

# A world where every tool is present, except those named; the installers are stubs.
make_world() {
    local dir="$1"
    shift
    local absent=" $* " tool
    mkdir -p "$dir/bin" "$dir/sys" "$dir/cargo/bin" "$dir/root/tools" "$dir/pg" "$dir/sbin" "$dir/rabbitmq"
    : >"$dir/installs"
    cp "$here/../../Cargo.lock" "$dir/root/Cargo.lock"
    # Only the system programs the installer needs, so that no real tool leaks in.
    for tool in bash awk env id basename dirname mkdir chmod grep; do
        ln -s "$(command -v "$tool")" "$dir/sys/$tool"
    done
    fake "$dir/bin/id" "0" # as root: apt-get is called directly
    # The stubs below make their fakes with the same functions as this test.
    { declare -f fake fake_trunk fake_wasm_bindgen fake_wasm_opt fake_esbuild fake_chromium fake_chromedriver \
        fake_postgres fake_pgbouncer fake_rabbitmq fake_patroni fake_etcd fake_haproxy fake_openssl_dev fake_schemathesis fake_aiosmtpd fake_axe_core make_pip; echo "lock_version=$lock_version"; } >"$dir/fakes.sh"
    [[ $absent == *" trunk "* ]] || fake_trunk "$dir/cargo/bin"
    [[ $absent == *" wasm-bindgen "* ]] || fake_wasm_bindgen "$dir/cargo/bin"
    [[ $absent == *" wasm-opt "* ]] || fake_wasm_opt "$dir/root/tools/node_modules/.bin"
    [[ $absent == *" esbuild "* ]] || fake_esbuild "$dir/root/tools/node_modules/.bin"
    [[ $absent == *" axe-core "* ]] || fake_axe_core "$dir/root/tools/node_modules"
    [[ $absent == *" chromium "* ]] || fake_chromium "$dir/bin"
    [[ $absent == *" chromedriver "* ]] || fake_chromedriver "$dir/bin"
    [[ $absent == *" postgresql "* ]] || fake_postgres "$dir/pg"
    [[ $absent == *" pgbouncer "* ]] || fake_pgbouncer "$dir/sbin"
    [[ $absent == *" rabbitmq-server "* ]] || fake_rabbitmq "$dir/rabbitmq"
    [[ $absent == *" patroni "* ]] || fake_patroni "$dir/sbin"
    [[ $absent == *" etcd-server "* ]] || fake_etcd "$dir/sbin"
    [[ $absent == *" haproxy "* ]] || fake_haproxy "$dir/sbin"
    [[ $absent == *" libssl-dev "* ]] || fake_openssl_dev "$dir/ssl" "$dir/bin"
    [[ $absent == *" schemathesis "* ]] || fake_schemathesis "$dir/root/tools/venv/bin"
    [[ $absent == *" aiosmtpd "* ]] || fake_aiosmtpd "$dir/root/tools/venv/bin"
    # A present venv has its pip (the stub below, which records what it is asked for).
    [[ $absent == *" schemathesis "* && $absent == *" aiosmtpd "* ]] || make_pip "$dir/root/tools/venv"
    [[ $absent == *" wasm32 "* ]] || : >"$dir/wasm32-installed"
    [[ $absent == *" trunk-0.22 "* ]] && fake "$dir/cargo/bin/trunk" "trunk 0.22.0"

    # The installers: each records its install request, then makes the fake it would install.
    cat >"$dir/bin/apt-get" <<STUB
#!/bin/bash
. "$dir/fakes.sh"
[ "\$1" = update ] && exit 0
shift 3 # install -y -qq
echo "apt-get install \$*" >>"$dir/installs"
for package in "\$@"; do
    case \$package in
        chromium) fake_chromium "$dir/bin" ;;
        chromium-driver) fake_chromedriver "$dir/bin" ;;
        postgresql) fake_postgres "$dir/pg" ;;
        pgbouncer) fake_pgbouncer "$dir/sbin" ;;
        rabbitmq-server) fake_rabbitmq "$dir/rabbitmq" ;;
        patroni) fake_patroni "$dir/sbin" ;;
        etcd-server) fake_etcd "$dir/sbin" ;;
        haproxy) fake_haproxy "$dir/sbin" ;;
        libssl-dev) fake_openssl_dev "$dir/ssl" "$dir/bin" ;;
        pkg-config) ;;
        npm) ;;
        *) echo "unexpected package \$package" >&2; exit 100 ;;
    esac
done
STUB
    cat >"$dir/bin/cargo" <<STUB
#!/bin/bash
. "$dir/fakes.sh"
echo "cargo \$*" >>"$dir/installs"
[ -n "\${FAIL_CARGO:-}" ] && { echo "error: failed to compile (stub)" >&2; exit 101; }
case \$2 in
    trunk) fake_trunk "$dir/cargo/bin" ;;
    wasm-bindgen-cli) fake_wasm_bindgen "$dir/cargo/bin" ;;
esac
STUB
    cat >"$dir/bin/npm" <<STUB
#!/bin/bash
. "$dir/fakes.sh"
echo "npm \$1" >>"$dir/installs"
fake_wasm_opt "$dir/root/tools/node_modules/.bin"
fake_esbuild "$dir/root/tools/node_modules/.bin"
fake_axe_core "$dir/root/tools/node_modules"
STUB
    # python3 -m venv DIR: a virtual environment whose pip records what it installs.
    cat >"$dir/bin/python3" <<STUB
#!/bin/bash
. "$dir/fakes.sh"
venv="\$3"
mkdir -p "\$venv/bin"
dir="$dir" make_pip "\$venv"
STUB
    cat >"$dir/bin/rustup" <<STUB
#!/bin/bash
if [ "\$2" = list ]; then
    echo x86_64-unknown-linux-gnu
    [ -e "$dir/wasm32-installed" ] && echo wasm32-unknown-unknown
    exit 0
fi
echo "rustup \$*" >>"$dir/installs"
: >"$dir/wasm32-installed"
STUB
    chmod +x "$dir/bin/"*
}

# Runs install_tools in the world, as scripts/test does (set -euo pipefail).
install_in() {
    local dir="$1"
    env -i HOME="$dir" CARGO_HOME="$dir/cargo" CHECKOUT_ROOT="$dir/root" CHECKOUT_PG_BIN="$dir/pg" \
        CHECKOUT_PGBOUNCER="$dir/sbin/pgbouncer" CHECKOUT_RABBITMQ_BIN="$dir/rabbitmq" CHECKOUT_OPENSSL_PC="$dir/ssl/pkgconfig/openssl.pc" \
        CHECKOUT_PATRONI="$dir/sbin/patroni" CHECKOUT_ETCD="$dir/sbin/etcd" CHECKOUT_HAPROXY="$dir/sbin/haproxy" \
        FAIL_CARGO="${FAIL_CARGO:-}" PATH="$dir/bin:$dir/sys" \
        "$(command -v bash)" -c "set -euo pipefail; . '$tools_sh'; install_tools" \
        >"$dir/stdout" 2>"$dir/stderr"
}

check() {
    local name="$1" ok="$2" detail="$3"
    if [ "$ok" = yes ]; then
        passed=$((passed + 1))
        echo "  ok    $name"
    else
        failed=$((failed + 1))
        echo "  FAIL  $name: $detail"
    fi
}

expect_installs() {
    local name="$1" dir="$2" status="$3"
    shift 3
    local want got
    want=$(printf '%s\n' "$@")
    got=$(cat "$dir/installs")
    if [ "$status" -eq 0 ] && [ "$got" = "$want" ]; then
        check "$name" yes ""
    else
        check "$name" no "exit $status; installed [${got//$'\n'/; }], wanted [${want//$'\n'/; }]; stderr: $(cat "$dir/stderr")"
    fi
}

echo "installer: each tool absent in turn, installers stubbed"
declare -A install_of=(
    [trunk]="cargo install trunk --version 0.21.14 --locked"
    [wasm-bindgen]="cargo install wasm-bindgen-cli --version $lock_version"
    [wasm-opt]="npm ci"
    [esbuild]="npm ci"
    [axe-core]="npm ci"
    [chromium]="apt-get install chromium"
    [chromedriver]="apt-get install chromium-driver"
    [postgresql]="apt-get install postgresql"
    [pgbouncer]="apt-get install pgbouncer"
    [rabbitmq-server]="apt-get install rabbitmq-server"
    [patroni]="apt-get install patroni"
    [etcd-server]="apt-get install etcd-server"
    [haproxy]="apt-get install haproxy"
    [libssl-dev]="apt-get install libssl-dev pkg-config"
    [wasm32]="rustup target add wasm32-unknown-unknown"
    [schemathesis]="pip install --quiet --disable-pip-version-check schemathesis==4.32.5"
    [aiosmtpd]="pip install --quiet --disable-pip-version-check aiosmtpd==1.4.6"
)
for tool in trunk wasm-bindgen wasm-opt esbuild axe-core chromium chromedriver postgresql pgbouncer rabbitmq-server patroni etcd-server haproxy libssl-dev wasm32 schemathesis aiosmtpd; do
    dir="$work/absent-$tool"
    make_world "$dir" "$tool"
    install_in "$dir"
    expect_installs "without $tool, installs exactly $tool" "$dir" $? "${install_of[$tool]}"
done

dir="$work/complete"
make_world "$dir"
install_in "$dir"
expect_installs "with every tool present, installs nothing" "$dir" $?

dir="$work/bare"
make_world "$dir" trunk wasm-bindgen wasm-opt esbuild axe-core chromium chromedriver postgresql pgbouncer rabbitmq-server patroni etcd-server haproxy libssl-dev wasm32 schemathesis aiosmtpd
install_in "$dir"
expect_installs "on a bare machine, installs everything" "$dir" $? \
    "apt-get install chromium chromium-driver postgresql pgbouncer rabbitmq-server patroni etcd-server haproxy libssl-dev pkg-config" \
    "rustup target add wasm32-unknown-unknown" \
    "${install_of[trunk]}" "${install_of[wasm-bindgen]}" "npm ci" "${install_of[schemathesis]}" \
    "${install_of[aiosmtpd]}"
: >"$dir/installs"
install_in "$dir"
expect_installs "run twice, the second run installs nothing" "$dir" $?

dir="$work/old-trunk"
make_world "$dir" trunk-0.22
install_in "$dir"
expect_installs "trunk 0.22 on PATH is replaced by 0.21.14" "$dir" $? "${install_of[trunk]}"

dir="$work/failing"
make_world "$dir" trunk
FAIL_CARGO=1 install_in "$dir"
status=$?
last=$(tail -n 1 "$dir/stderr")
if [ "$status" -ne 0 ] && [[ $last == "bash: installing trunk 0.21.14 with cargo"*"failed: "*"status 101"* ]]; then
    check "a failing installer stops the script with one line naming the step" yes ""
else
    check "a failing installer stops the script with one line naming the step" no "exit $status, last line: $last"
fi

echo "installer: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
