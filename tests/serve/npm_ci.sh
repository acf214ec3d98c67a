#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs the pinned npm packages of tests/serve (package-lock.json) into its node_modules,
# unless the same lock is already installed. Run by ctest as the setup of the serving tests;
# needs node, npm and the npm registry.
set -euo pipefail
cd "$(dirname "$0")"
stamp=node_modules/.lockstep-lock.sha256
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "npm_ci: node_modules is up to date"
  exit 0
fi
npm ci --no-audit --no-fund --loglevel=error
echo "$want" > "$stamp"
echo "npm_ci: installed openai $(node -p "require('./node_modules/openai/package.json').version")," \
  "@anthropic-ai/sdk $(node -p "require('./node_modules/@anthropic-ai/sdk/package.json').version")"
