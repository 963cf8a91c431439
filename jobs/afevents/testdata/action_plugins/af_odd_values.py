# Test action: returns values that are not JSON (bytes, a set, a datetime, NaN, a tuple key)
# plus a warning and a deprecation, as a real action plugin may.
import datetime

from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        result.update(
            changed=False,
            raw=b'\xffbytes',
            tags={'b', 'a'},
            when=datetime.datetime(2024, 1, 2, 3, 4, 5),
            nan=float('nan'),
            tuple_key={(1, 2): 'pair'},
            warnings=['af odd values warning'],
            deprecations=[{'msg': 'af odd values deprecation', 'version': '99.0'}],
        )
        return result
