#!/usr/bin/env bash
# Applies an example to the inferd that make run serves and calls it as the
# example's README does, saying each command as it runs it:
#   scripts/example.sh NAME        (make example-NAME)
# NAME: echo, batch, stream, potassium, openai-mock, digits, openai-js,
# banana-js. INFERD (default ./inferd) and CONFIG (default
# config.example.yaml) say which daemon; it must be serving (make run in
# another terminal). It changes nothing but the example's own projects,
# teams and a key for them, and exits non-zero when an answer is not the
# one its README shows.
set -euo pipefail
cd "$(dirname "$0")/.."
INFERD=${INFERD:-./inferd}
CONFIG=${CONFIG:-config.example.yaml}
name=${1:?usage: scripts/example.sh NAME (echo, batch, stream, potassium, openai-mock, digits, openai-js, banana-js)}
[ -d "examples/$name" ] || { echo "example: no examples/$name" >&2; exit 2; }

listen=$(sed -n 's/^listen:[[:space:]]*\([^[:space:]#]*\).*/\1/p' "$CONFIG" | head -n1)
BASE=${BASE:-http://${listen:-127.0.0.1:8080}}
if ! curl -sf "$BASE/healthz" >/dev/null; then
	echo "example: no inferd answers on $BASE: start it with make run (or $INFERD --config $CONFIG serve) in another terminal" >&2
	exit 1
fi

say() { echo "+ $*" >&2; }
run() { say "$@"; "$@"; }
# json FILTER: reads a JSON answer on stdin, prints the Python expression
# FILTER of it (j is the answer).
json() { python3 -c "import json,sys; j=json.load(sys.stdin); print($1)"; }
# expect TEXT WHAT: stdin must contain TEXT.
expect() {
	local out
	out=$(cat)
	echo "$out"
	if ! grep -qF -- "$1" <<<"$out"; then
		echo "example $name: $2: the answer lacks $1" >&2
		exit 1
	fi
}
key() { run "$INFERD" --config "$CONFIG" key create --team "$1" | tail -n1; }
apply() { run "$INFERD" --config "$CONFIG" apply -f "$1" >&2; }
start() { # start MODELKEY INPUTS [more fields]
	say curl -s "$BASE/start/v4" -d "{\"apiKey\":\"\$KEY\",\"modelKey\":\"$1\",\"modelInputs\":$2${3:+,$3}}"
	curl -s "$BASE/start/v4" -d "{\"apiKey\":\"$KEY\",\"modelKey\":\"$1\",\"modelInputs\":$2${3:+,$3}}"
}
# call MODELKEY INPUTS: a start, then, while its call is unfinished (a
# replica still booting past startWait: PyTorch's import and training on a
# busy machine), checks with longPoll until it is, as a Banana client does.
# Prints the answer that finished it.
call() {
	local out id i
	out=$(start "$1" "$2")
	for i in $(seq 20); do
		if [ "$(json 'j.get("finished", True)' <<<"$out")" != False ]; then
			echo "$out"
			return
		fi
		id=$(json 'j["callID"]' <<<"$out")
		say curl -s "$BASE/check/v4" -d "{\"apiKey\":\"\$KEY\",\"longPoll\":true,\"callID\":\"$id\"}"
		out=$(curl -s "$BASE/check/v4" -d "{\"apiKey\":\"$KEY\",\"longPoll\":true,\"callID\":\"$id\"}")
	done
	echo "$out"
}
npm_ready() {
	if [ ! -d "examples/$name/node_modules" ]; then
		(cd "examples/$name" && run npm ci --no-audit --no-fund --loglevel=error)
	fi
}

case $name in
echo)
	apply examples/projects.yaml
	KEY=$(key demo)
	call mk-echo-1 '{"prompt":"hi"}' | expect '"message":"success"' "the README's first call"
	;;
batch | stream | potassium | digits)
	apply "examples/$name/project.yaml"
	KEY=$(key demo)
	case $name in
	batch) call mk-batch-1 '{"n":1}' | expect '"batchSize":' "a call in a batch" ;;
	potassium) call mk-potassium-1 '{"prompt":"hi"}' | expect '"message":"success"' "a call of the Potassium app" ;;
	digits)
		call mk-digits-1 '{"pixels":[0,0,5,13,9,1,0,0,0,0,13,15,10,15,5,0,0,3,15,2,0,11,8,0,0,4,12,0,0,8,8,0,0,5,8,0,0,9,8,0,0,4,11,0,1,12,7,0,0,2,14,5,10,12,0,0,0,0,6,13,10,0,0,0]}' |
			expect '"digit":' "a digit's class"
		;;
	stream)
		CALL=$(start mk-stream-1 '{"prompt":"one two three","delay":0.2}' '"startOnly":true' | json 'j["callID"]')
		say curl -sN "$BASE/v1/calls/$CALL/events" -H 'X-Service-API-Key: $KEY'
		curl -sN --max-time 120 "$BASE/v1/calls/$CALL/events" -H "X-Service-API-Key: $KEY" |
			expect 'event: done' "the streamed events"
		;;
	esac
	;;
openai-mock)
	apply examples/openai-mock/project.yaml
	KEY=$(key demo)
	say curl -s "$BASE/v1/chat/completions" -H 'Authorization: Bearer $KEY' \
		-d '{"model":"my-llm","messages":[{"role":"user","content":"hello there"}]}'
	curl -s "$BASE/v1/chat/completions" -H "Authorization: Bearer $KEY" \
		-d '{"model":"my-llm","messages":[{"role":"user","content":"hello there"}]}' |
		expect 'echo: hello there' "a chat completion"
	;;
openai-js)
	npm_ready
	apply examples/openai-js/projects.yaml
	KEY=$(key llm) OTHER=$(key other) TIGHT=$(key tight)
	# The first test scales chat from zero: wait for a replica left by an
	# earlier run to stop (its idleTimeout is 5 s).
	for i in $(seq 120); do
		n=$(curl -s "$BASE/v1/status/projects" -H "X-Service-API-Key: $KEY" |
			json 'sum(len(p["replicas"] or []) for p in j["results"] if p["id"] == "chat")')
		[ "$n" = 0 ] && break
		[ "$i" = 120 ] && { echo "example: project chat still has $n replicas after 60 s" >&2; exit 1; }
		sleep 0.5 # polls the status: the daemon has no event for this to wait on
	done
	cd examples/openai-js
	INFERD_BASE=$BASE INFERD_KEY=$KEY INFERD_OTHER_KEY=$OTHER INFERD_TIGHT_KEY=$TIGHT \
		run node --test --test-reporter=spec openai.test.js
	;;
banana-js)
	npm_ready
	apply examples/banana-js/projects.yaml
	KEY=$(key bananas)
	port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
	fifo=$(mktemp -u) && mkfifo "$fifo"
	node examples/banana-js/retry-proxy.mjs "$port" "$BASE" >"$fifo" &
	proxy=$!
	trap 'kill $proxy 2>/dev/null; rm -f "$fifo"' EXIT
	read -r _ <"$fifo" # "listening"
	cd examples/banana-js
	BANANA_URL=$BASE/ INFERD_BASE=$BASE INFERD_KEY=$KEY INFERD_MODEL=mk-banana INFERD_PROJECT=banana-echo \
		INFERD_RUN_URL=$BASE/run/kclient INFERD_PROXY_URL=http://127.0.0.1:$port/run/kclient \
		run node --test --test-reporter=spec clients.test.js client.test.js
	;;
*)
	echo "example: $name has no make target; see examples/$name/README.md" >&2
	exit 2
	;;
esac
echo "example $name: answered as its README says" >&2
