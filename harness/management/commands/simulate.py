"""`manage.py simulate --seed N --minutes M [--customers K] [--keep]`: the seeded simulation of the
whole exchange under faults (harness/simulation, which says what it does and checks). It
starts its own PostgreSQL cluster and Redis and the stack exactly as `make run` does; this process's
database settings are not used. `--lab`: on the HA lab instead, with the lab's faults
(harness/simulation/lab.py); exit status 2 when the lab is not up. Exit status 1 when an end
check fails."""

from django.core.management.base import BaseCommand, CommandError

from harness.simulation.run import run


class Command(BaseCommand):
    help = "Run the seeded simulation (random customers through every flow, random faults, end checks)."

    def add_arguments(self, parser):
        parser.add_argument("--seed", type=int, required=True, help="The same seed gives the same schedule.")
        parser.add_argument("--minutes", type=float, default=1.0, help="Length of the load (default 1).")
        parser.add_argument("--customers", type=int, default=4, help="Customers, each with a sub-account (default 4).")
        parser.add_argument("--keep", action="store_true", help="Keep the logs in the run's temporary directory.")
        parser.add_argument(
            "--lab",
            action="store_true",
            help="On the HA lab (python -m harness.lab up first), with its faults drawn by the seed.",
        )

    def handle(self, *args, **options):
        if options["minutes"] <= 0 or options["customers"] < 1:
            raise CommandError("--minutes must be positive and --customers at least 1")
        if options["lab"]:
            from harness.simulation.lab import lab_is_up

            if not lab_is_up():
                raise CommandError("the HA lab is not up: python -m harness.lab up", returncode=2)
        result = run(
            options["seed"],
            options["minutes"],
            customers=options["customers"],
            out=self.stdout,
            keep=options["keep"],
            lab=options["lab"],
        )
        if not result.ok:
            raise CommandError(f"simulation seed {options['seed']}: {len(result.violations)} problem(s), see above")
