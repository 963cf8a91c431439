# Drives af_events.py directly, outside ansible-playbook, for the corners a playbook cannot
# reach: bad AF_EVENTS_FD values, an exception inside a callback, a reader that went away, a
# vaulted value, a line over the limit. Usage: python3 driver.py <af_events.py> <scratch dir>
# Prints one JSON report on stdout; TestPluginCorners checks it.
import importlib.util
import json
import os
import sys
import tempfile

from ansible.inventory.host import Host
from ansible.executor.task_result import TaskResult
from ansible.parsing.yaml.objects import AnsibleVaultEncryptedUnicode
from ansible.playbook.task import Task

spec = importlib.util.spec_from_file_location('af_events', sys.argv[1])
af = importlib.util.module_from_spec(spec)
spec.loader.exec_module(af)
scratch = sys.argv[2]
report = {}


def disabled_with(value):
    if value is None:
        os.environ.pop(af.ENV_FD, None)
    else:
        os.environ[af.ENV_FD] = value
    cb = af.CallbackModule()
    return {'disabled': bool(getattr(cb, 'disabled', False)), 'env_left': af.ENV_FD in os.environ}


r, w = os.pipe()
os.close(r)
os.close(w)
report['unset'] = disabled_with(None)
report['stdout_fd'] = disabled_with('1')
report['garbage'] = disabled_with('three')
report['closed_fd'] = disabled_with(str(w))


class Playbook:
    _file_name = 'site.yml'


class Stats:
    def __init__(self, hosts):
        counts = dict(('host-%05d.example.com' % i, 1) for i in range(hosts))
        for name in ('ok', 'changed', 'failures', 'dark', 'skipped', 'rescued', 'ignored', 'processed'):
            setattr(self, name, counts)
        self.custom = {}


# A regular file rather than a pipe: nothing reads while the driver writes a long line.
fd, path = tempfile.mkstemp(dir=scratch)
os.environ[af.ENV_FD] = str(fd)
cb = af.CallbackModule()
working = {
    'disabled': bool(getattr(cb, 'disabled', False)),
    'env_left': af.ENV_FD in os.environ,
    'inheritable': os.get_inheritable(fd),
}
cb.v2_playbook_on_start(Playbook())
cb.v2_runner_on_ok(None)  # AttributeError inside: must become a warning event
cb._display.warning('driver warning')
cb._display.warning('driver warning')  # shown once by ansible, reported once by the plugin

hidden_task = Task()
hidden_task.name = 'hidden'
hidden_task.no_log = True
cb.v2_runner_on_ok(TaskResult(Host('h1'), hidden_task, {
    'changed': True, 'invocation': {'module_args': {'password': 'canary-driver-secret'}}}))

plain_task = Task()
plain_task.name = 'plain'
cb.v2_runner_on_ok(TaskResult(Host('h1'), plain_task, {
    'changed': False,
    'ansible_facts': {'ansible_env': {'TOKEN': 'canary-driver-env'}, 'kept': 1},
    'results': [
        {'item': 'public', '_ansible_no_log': False},
        {'item': 'canary-driver-item', '_ansible_no_log': True,
         'invocation': {'module_args': {'x': 'canary-driver-item'}}},
    ],
    'vaulted': AnsibleVaultEncryptedUnicode('$ANSIBLE_VAULT;1.1;AES256\n3132333435'),
}))

af.MAX_LINE_BYTES = 100000
cb.v2_playbook_on_stats(Stats(2000))
os.close(fd)
with open(path, 'rb') as f:
    working['lines'] = [line.decode('utf-8') for line in f.read().splitlines(True)]
report['working'] = working

r, w = os.pipe()
os.close(r)
os.environ[af.ENV_FD] = str(w)
cb = af.CallbackModule()
cb.v2_playbook_on_start(Playbook())  # EPIPE: must not raise
cb.v2_playbook_on_start(Playbook())
report['broken_pipe'] = {'disabled': bool(getattr(cb, 'disabled', False)), 'stopped': cb._fd is None}

sys.stdout.write(json.dumps(report))
