#!/bin/bash
# MariaDB for slurmdbd: initialise the data dir on first start, create the
# accounting database and its user, then run mariadbd in the foreground.
#   SLURMDB_NAME (slurm_acct_db), SLURMDB_USER (slurm), SLURMDB_PASSWORD
# Healthy (for compose) once `mysqladmin --protocol=tcp ping` answers: the
# temporary setup server below listens on the socket only.
set -euo pipefail
DB=${SLURMDB_NAME:-slurm_acct_db} USER_=${SLURMDB_USER:-slurm} PASS=${SLURMDB_PASSWORD:-gpushare-test}
DATADIR=/var/lib/mysql
mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld "$DATADIR"

if [[ ! -d $DATADIR/mysql ]]; then
  echo "mariadb: initialising $DATADIR"
  mariadb-install-db --user=mysql --datadir="$DATADIR" --skip-test-db --auth-root-authentication-method=socket >/dev/null
  mariadbd --user=mysql --datadir="$DATADIR" --skip-networking --socket=/run/mysqld/setup.sock &
  pid=$!
  for _ in $(seq 1 60); do mysqladmin --socket=/run/mysqld/setup.sock ping >/dev/null 2>&1 && break; sleep 0.5; done
  mariadb --socket=/run/mysqld/setup.sock <<SQL
CREATE DATABASE IF NOT EXISTS \`$DB\`;
CREATE USER IF NOT EXISTS '$USER_'@'%' IDENTIFIED BY '$PASS';
GRANT ALL ON \`$DB\`.* TO '$USER_'@'%';
FLUSH PRIVILEGES;
SQL
  mysqladmin --socket=/run/mysqld/setup.sock shutdown
  wait "$pid" || true
  echo "mariadb: database $DB and user $USER_ created"
fi

# slurmdbd recommends these (slurm accounting.html): big buffer pool, long lock wait.
exec mariadbd --user=mysql --datadir="$DATADIR" --bind-address=0.0.0.0 --port=3306 \
  --innodb-buffer-pool-size=256M --innodb-lock-wait-timeout=900 --max-allowed-packet=64M \
  --skip-name-resolve "$@"
