# The import name of the framework: "from potassium import Potassium, Request,
# Response" in app.py finds this file (the script's directory comes first on
# sys.path) and gets the test double in fake_potassium.py. Delete this file and
# fake_potassium.py, and `pip install potassium`, to run app.py on the real thing.
from fake_potassium import Potassium, Request, Response  # noqa: F401
