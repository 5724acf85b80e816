#!/bin/sh
# Docker Compose demo: creates the OpenFGA store the relay writes to, with its authorization
# model, unless it exists already. Idempotent, so `docker compose up` can run it again and again:
# the store is found by name (the relay resolves FGA_STORE_NAME the same way, and refuses a name
# that two stores share).
#
# Environment: FGA_API_URL (read by fga itself), DEMO_STORE_NAME, DEMO_MODEL_FILE.
# A store that already has a model keeps it: after editing model.fga, write it with
#   docker compose run --rm --entrypoint fga openfga-init model write --store-id ID --file /demo/model.fga
# or start afresh with `docker compose down -v`.
set -eu

name=${DEMO_STORE_NAME:?DEMO_STORE_NAME is not set}
model=${DEMO_MODEL_FILE:?DEMO_MODEL_FILE is not set}

# fga prints compact JSON when its output is not a terminal. (An assignment fails with its command
# substitution, so `set -e` stops here if OpenFGA cannot be reached.)
stores=$(fga store list)
ids=$(printf '%s' "$stores" | jq -r --arg name "$name" '.stores[] | select(.name == $name) | .id')
count=$(printf '%s' "$ids" | grep -c . || true)

case $count in
0)
    echo "openfga-init: creating the store \"$name\" with the model in $model"
    fga store create --name "$name" --model "$model"
    ;;
1)
    listed=$(fga model list --store-id "$ids")
    models=$(printf '%s' "$listed" | jq '.authorization_models | length')
    if [ "$models" -eq 0 ]; then
        echo "openfga-init: the store \"$name\" ($ids) has no model: writing $model"
        fga model write --store-id "$ids" --file "$model"
    else
        echo "openfga-init: the store \"$name\" ($ids) exists with its model: nothing to do"
    fi
    ;;
*)
    echo "openfga-init: $count stores are named \"$name\"; keep one (fga store delete --store-id ID)" >&2
    exit 1
    ;;
esac
